"""Small shared helpers; ``is_flash_attn_available`` is re-exported for ``from verl.utils import ...``."""


def is_flash_attn_available() -> bool:
    """True when a CUDA device is present and flash-attn imports (see :mod:`verl.utils.model`)."""
    from verl.utils.model import is_flash_attn_available as available

    return available()
