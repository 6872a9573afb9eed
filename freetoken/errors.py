"""Typed errors. Each message is one line naming the file/field/tensor and what was expected."""


class FreeTokenError(Exception):
    """Base class for every error FreeToken raises on bad input."""


class CheckpointError(FreeTokenError):
    """A checkpoint file is missing, malformed, or holds a tensor of the wrong shape/dtype."""


class UnsupportedModelError(FreeTokenError):
    """The checkpoint's architecture or a config value is not supported."""


class PromptTooLongError(FreeTokenError, ValueError):
    """A prompt (plus at least one generated token) does not fit the context window."""


class InvalidRequestError(FreeTokenError, ValueError):
    """Sampling parameters or other request fields are out of range."""


class NumericalError(FreeTokenError):
    """The model produced NaN logits (damaged weights or an overflow in a kernel)."""


class PullError(FreeTokenError):
    """A download failed: unknown name, no network, not enough disk, a checksum mismatch."""
