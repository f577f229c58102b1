"""The TensorFlow and Keras trainers, under Horovod: the same ImageNet-layout data, bad-file rules and ResNets as the
PyTorch trainer (train.py), without torch (the TensorFlow image has none).

loop.py (--framework tensorflow: a custom loop) and fit.py (--framework keras: model.fit) are the entry points; run.py
is the adapter they share to the training loop of trainer/core.py (Horovod, the model and optimizer, a step,
validation, the collectives), checkpoints.py its checkpoint files; options.py their options. models.py: the ResNets
of torchvision's names, built in Keras (tf_keras). data.py: the input pipeline (tf.data) over the folder layout.py
indexes, with badfiles.py's rules for images that cannot be decoded.
"""

import os

# Keras 3 (TensorFlow >= 2.16's tf.keras) fails under Horovod (horovod#4290): tf.keras must be tf_keras, chosen
# before anything imports TensorFlow. Import tf_keras itself as `keras` (`import tf_keras as keras`).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ log (oneDNN notices, a traceback for an image the PIL fallback then refuses) goes to stderr around
# the trainer's own lines; warnings and errors stay.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
