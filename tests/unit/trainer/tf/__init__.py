"""Tests of the TensorFlow and Keras trainers (containers/trainer/tf), some against the PyTorch trainer's parts
(tests/conftest.py imports torchvision first: importing it after TensorFlow crashes the process)."""
