"""The augmentation and evaluation recipe of every framework's input pipeline (data.py, dali.py, tf/data.py): the
ImageNet reference's numbers, declared once. Torch-free and TensorFlow-free."""

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's per-channel mean and std, of values in [0, 1]
RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect ratios, drawn uniformly between their logarithms
VAL_SCALE = 0.875  # validation: the shorter side resized to size / 0.875 (256 for 224), then the centre crop
SYNTHETIC_STEPS = 100  # an epoch of synthetic data without --steps-per-epoch


def val_resize(size: int) -> int:
    """The shorter side validation images are resized to before the centre crop of `size`."""
    return round(size / VAL_SCALE)
