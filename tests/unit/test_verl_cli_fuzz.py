"""Fuzzed verl command lines: random keys (ours, verl's, made up), values, ``+``/``++``/``~`` forms and quoting
through ``python -m verl.trainer.main_ppo --print-config`` give a resolved config or a one-line error naming
a key or the override: never a traceback."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr, redirect_stdout

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl.config import TrainerConfig
from verl.config.loader import schema_fields
from verl.config.verl_compat import verl_keys

OUR_KEYS = sorted(schema_fields(TrainerConfig))
VERL_KEYS = sorted(verl_keys("ppo_trainer"))
SEGMENTS = sorted({part for key in OUR_KEYS + VERL_KEYS for part in key.split(".")})

made_up_keys = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map(".".join)
garbage_keys = st.text(alphabet="abc._-+~=[]{}'\" 1é", min_size=0, max_size=12)
keys = st.one_of(st.sampled_from(OUR_KEYS), st.sampled_from(VERL_KEYS), made_up_keys, garbage_keys)

scalars = st.one_of(
    st.integers(-(2**40), 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "False", "null", "", "~", "auto", "vllm", "fsdp", "grpo", "console", "1e-6"]),
    st.text(alphabet="abc xyz/:.,-_'\"[]{}$#", max_size=10),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
    scalars.map(lambda v: f"'{v}'"),
    scalars.map(lambda v: f'"{v}"'),
    scalars.map(lambda v: "{a: " + v + "}"),
)
prefixes = st.sampled_from(["", "", "+", "++", "~"])


@st.composite
def overrides(draw) -> str:
    prefix, key = draw(prefixes), draw(keys)
    if prefix == "~" and draw(st.booleans()):
        return f"~{key}"
    return f"{prefix}{key}={draw(values)}"


DOTTED = re.compile(r"[A-Za-z_][\w\-]*(\.[\w\-]+)+")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(overrides(), min_size=1, max_size=4))
def test_fuzzed_command_lines_resolve_or_name_the_problem(argv: list[str]) -> None:
    from verl.trainer.main_ppo import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(["--print-config", *argv])  # anything but a user error propagates and fails the test
        except SystemExit as e:  # argparse: an unknown option, or a flag's value it refuses, in one line
            assert e.code == 2 and "error:" in err.getvalue() and "Traceback" not in err.getvalue()
            return
    message = err.getvalue().strip()
    assert "Traceback" not in message
    if rc == 0:
        assert out.getvalue().startswith("data:")
        return
    assert rc in (2, 3), message
    assert message.startswith(("config error:", "input error:")) and "\n" not in message, message
    # the message names the override, a key, or (for a cross-key rule) the keys it relates
    named = [n for text in argv for n in (text, repr(text), text.split("=")[0].lstrip("+~").strip()) if n]
    assert any(n in message for n in named) or DOTTED.search(message), message
