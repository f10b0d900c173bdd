"""Placeholder: the tensorboard integration (issue 7) is being written."""

SUPPORTED = ""


def get_version():
    return None


def patch():
    pass


def unpatch():
    pass
