"""Tests of the TensorFlow and Keras trainers (containers/trainer/tf), some against the PyTorch trainer's parts."""

# torchvision before TensorFlow: importing it loads Triton's libtriton (through torch._dynamo), which crashes the
# process (a segmentation fault) once TensorFlow is loaded; in the other order both work.
import torchvision  # noqa: F401
