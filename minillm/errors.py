"""The errors minillm raises on bad input. Each message names the problem and, where there is one, the fix."""


class MinillmError(Exception):
    """Base class: the CLI prints these as one clear line instead of a traceback."""


class ConfigError(MinillmError, ValueError):
    """A setting that cannot work."""


class InputError(MinillmError, ValueError):
    """A prompt or generation request that cannot be served."""


class CheckpointError(MinillmError):
    """A checkpoint that is missing, unreadable or does not match the model."""


class DeviceError(MinillmError):
    """A device that was asked for but is not available."""
