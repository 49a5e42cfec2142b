"""The built-in tools (calculator, Python sandbox) and the tool config loader.

Every piece of code given to the sandbox is bounded by construction (a loop of 50 or 200 steps, a lazily
zeroed bytearray), except the CPU spin, which the limits under test end.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from verl.config.errors import ConfigError
from verl.tools import BaseTool, OpenAIFunctionToolSchema, ToolError, ToolResponse, python_sandbox
from verl.tools.calculator import CALCULATOR_SCHEMA, CalculatorTool
from verl.tools.config import TOOL_CONFIG_KEY, TOOLS_DIR
from verl.tools.loader import load_tools, tool_schemas
from verl.tools.python_sandbox import PYTHON_SCHEMA, PythonTool


def call(tool: BaseTool, **parameters) -> str:
    response, reward, _ = asyncio.run(tool.execute("trajectory-0", parameters))
    assert isinstance(response, ToolResponse) and reward == 0.0
    return response.text


def call_error(tool: BaseTool, **parameters) -> str:
    with pytest.raises(ToolError) as caught:
        asyncio.run(tool.execute("trajectory-0", parameters))
    return str(caught.value)


# ---------------------------------------------------------------------------------------------------------
# calculator


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("1234+5678", "6912"),
        ("2 + 3 * 4", "14"),  # * before +
        ("(2 + 3) * 4", "20"),
        ("2 ** 3 ** 2", "512"),  # ** is right-associative: 2 ** 9
        ("-2 ** 2", "-4"),  # ** binds tighter than unary minus
        ("17 // 5 * 5 + 17 % 5", "17"),
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),  # an integral float prints as an int
        ("0.5 * 3", "1.5"),
        ("2 ** -2", "0.25"),
        ("-(-3) + +4", "7"),
        ("10 ** 20", "100000000000000000000"),
    ],
)
def test_calculator_values(expression, expected):
    assert call(CalculatorTool(), expression=expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("__import__('os')", "not allowed"),
        ("().__class__", "not allowed"),
        ("[1, 2]", "unsupported syntax"),
        ("x + 1", "not allowed"),
        ("1 +", "invalid expression"),
        ("2 << 3", "unsupported operator"),
        ("True + 1", "only numbers"),
        ("1e308 * 10", "not a finite number"),
        ("(-8) ** 0.5", "complex"),
        ("1" * 2000, "too long"),
    ],
)
def test_calculator_errors(expression, message):
    assert message in call_error(CalculatorTool(), expression=expression)


def test_calculator_refuses_huge_powers_at_once():
    start = time.monotonic()
    for expression in ("9**9**9", "10**100000", "2**4097", "(10**1000)**1000", "2.0**100000"):
        assert "too large" in call_error(CalculatorTool(), expression=expression)
    assert time.monotonic() - start < 1.0


def test_calculator_arguments():
    tool = CalculatorTool()
    assert "missing argument" in call_error(tool)
    assert "must be a string" in call_error(tool, expression=12)
    assert tool.get_openai_tool_schema().to_dict() == CALCULATOR_SCHEMA
    with pytest.raises(ValueError, match="unknown config keys"):
        CalculatorTool({"precision": 3})


# ---------------------------------------------------------------------------------------------------------
# tool config loading

USER_TOOL = """
from verl.tools import BaseTool, ToolResponse

class EchoTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(self.config["prefix"] + parameters["text"]), 0.0, {}

NOT_A_TOOL = 3
"""

ECHO_SCHEMA = """
    tool_schema:
      type: function
      function:
        name: echo
        description: repeat the text
        parameters: {type: object, properties: {text: {type: string}}, required: [text]}
"""


def write_config(tmp_path: Path, body: str, name: str = "tools.yaml") -> str:
    (tmp_path / "echo_tool.py").write_text(USER_TOOL)
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_load_tools_builtin_and_user_file(tmp_path):
    path = write_config(
        tmp_path,
        f"""
tools:
  - class_name: verl.tools.calculator.CalculatorTool
    config: {{type: native}}
  - class_name: {tmp_path}/echo_tool.py:EchoTool
    config: {{prefix: "> "}}
{ECHO_SCHEMA}
  - class_name: verl.tools.python_sandbox:PythonTool
    config: {{wall_time_s: 3}}
""",
    )
    calculator, echo, python = load_tools(path)
    assert isinstance(calculator, CalculatorTool) and isinstance(python, PythonTool)
    assert [tool.name for tool in (calculator, echo, python)] == ["calculator", "echo", "python"]
    assert python.wall_time_s == 3 and python.cpu_time_s == 5  # the rest are the defaults
    schemas = tool_schemas([calculator, echo, python])
    assert schemas[0] == CALCULATOR_SCHEMA and schemas[2] == PYTHON_SCHEMA
    assert schemas[1]["function"]["parameters"]["required"] == ["text"]
    assert call(echo, text="hi") == "> hi"
    assert call(calculator, expression="3*4") == "12"


def test_load_tools_finds_a_relative_file_next_to_the_yaml(tmp_path):
    path = write_config(
        tmp_path, f"tools:\n  - class_name: echo_tool.py:EchoTool\n    config: {{prefix: ''}}\n{ECHO_SCHEMA}"
    )
    (echo,) = load_tools(path)
    assert echo.name == "echo"


@pytest.mark.parametrize(
    "name, tool_class", [("calculator.yaml", CalculatorTool), ("python.yaml", PythonTool)]
)
def test_shipped_tool_configs(name, tool_class):
    (tool,) = load_tools(str(TOOLS_DIR / name))
    assert isinstance(tool, tool_class)
    assert tool.get_openai_tool_schema().to_dict() == tool_class.default_tool_schema


CALC_ENTRY = "  - class_name: verl.tools.calculator.CalculatorTool\n"
CALC = "tools:\n" + CALC_ENTRY


@pytest.mark.parametrize(
    "body, entry, message",
    [
        ("other: 1\n", None, "'tools' list"),
        ("tools: []\n", None, "non-empty list"),
        ("tools: [1, 2\n", None, "cannot read it as YAML"),
        ("tools:\n  - config: {}\n", "tools[0]", "needs a class_name"),
        (CALC + "  - class_name: no_such_package.tools.Tool\n", "tools[1].class_name", "cannot import"),
        (
            "tools:\n  - class_name: verl.tools.calculator.NoSuchTool\n",
            "tools[0].class_name",
            "no tool class",
        ),
        ("tools:\n  - class_name: CalculatorTool\n", "tools[0].class_name", "package.module.Class"),
        (
            "tools:\n  - class_name: echo_tool.py:NOT_A_TOOL\n",
            "tools[0] (echo_tool.py:NOT_A_TOOL)",
            "BaseTool",
        ),
        ("tools:\n  - class_name: verl.tools.base.ToolError\n", "tools[0]", "not a subclass of"),
        (
            "tools:\n  - class_name: echo_tool.py:EchoTool\n",
            "tools[0] (echo_tool.py:EchoTool)",
            "tool_schema is missing",
        ),
        (
            CALC + "    tool_schema: {type: function, function: {description: x}}\n",
            "tools[0] (verl.tools.calculator.CalculatorTool): tool_schema",
            "function.name is missing",
        ),
        (
            CALC + "    tool_schema: {type: function, function: {name: c, parameters: {type: array}}}\n",
            "tools[0]",
            "parameters.type must be 'object'",
        ),
        (
            CALC
            + "    tool_schema:\n      function: {name: c, parameters: {properties: {a: {}}, required: [b]}}\n",
            "tools[0]",
            "required must list names from properties",
        ),
        (CALC + "    config: {digits: 3}\n", "tools[0]", "unknown config keys"),
        (CALC + "    schema: {}\n", "tools[0]", "unknown keys ['schema']"),
        (CALC + "    config: [1]\n", "tools[0]", "config must be a mapping"),
        (
            "tools:\n  - class_name: verl.tools.python_sandbox.PythonTool\n    config: {cpu_time_s: -1}\n",
            "tools[0] (verl.tools.python_sandbox.PythonTool)",
            "cpu_time_s must be a positive number",
        ),
        (CALC + CALC_ENTRY, "tools[1] and tools[0]", "both named 'calculator'"),
    ],
)
def test_load_tools_errors_name_key_file_and_entry(tmp_path, monkeypatch, body, entry, message):
    monkeypatch.chdir(tmp_path)  # for the relative echo_tool.py
    path = write_config(tmp_path, body)
    with pytest.raises(ConfigError) as caught:
        load_tools(path)
    text = str(caught.value)
    assert text.startswith(f"{TOOL_CONFIG_KEY}={path}"), text
    assert message in text, text
    if entry is not None:
        assert entry in text, text


def test_load_tools_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{TOOL_CONFIG_KEY}={missing}: no such file"):
        load_tools(str(missing))
    with pytest.raises(ConfigError, match=TOOL_CONFIG_KEY):
        load_tools("")


# ---------------------------------------------------------------------------------------------------------
# Python sandbox


def assert_still_works(tool: PythonTool) -> None:
    assert call(tool, code="print(sum(range(10)))") == "45\n"


def sleep_30_pids() -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() == b"sleep\x0030\x00":
                    pids.add(int(entry))
            except OSError:
                pass
    return pids


def assert_no_new_sleepers(before: set[int]) -> None:
    deadline = time.monotonic() + 3  # SIGKILL is delivered asynchronously
    while sleep_30_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sleep_30_pids() - before


def test_python_prints_output():
    tool = PythonTool()
    response, reward, metrics = asyncio.run(tool.execute("t", {"code": "x = 6 * 7\nprint('x =', x)"}))
    assert response.text == "x = 42\n" and reward == 0.0
    assert metrics["exit_code"] == 0 and metrics["wall_s"] > 0
    assert call(tool, code="y = 1") == "(no output)"
    assert call(tool, code="import sys\nprint('warning', file=sys.stderr)") == "warning\n"
    assert tool.get_openai_tool_schema().name == "python"


def test_python_truncates_output():
    tool = PythonTool({"max_output_chars": 100})
    text = call(tool, code="print('a' * 5000)")  # 5001 characters with the newline
    assert text == "a" * 100 + "\n...[truncated 4901 chars]"
    text = call(tool, code="for i in range(200000): print(i)")
    assert text.startswith("0\n1\n2\n") and "...[truncated " in text and len(text) < 200


def test_python_errors_show_the_traceback():
    tool = PythonTool()
    message = call_error(tool, code="def f():\n    return 1 / 0\nf()")
    assert message.startswith("exit code 1:") and "ZeroDivisionError: division by zero" in message
    assert 'File "<code>", line 2, in f' in message and "<string>" not in message  # no bootstrap frames
    assert "SyntaxError" in call_error(tool, code="print(1")
    assert call_error(tool, code="import sys\nsys.exit(3)") == "exit code 3"
    assert "missing argument" in call_error(tool)
    assert "must be a string" in call_error(tool, code=["print(1)"])


def test_python_infinite_loop_hits_the_cpu_limit():
    tool = PythonTool({"cpu_time_s": 1, "wall_time_s": 3})
    start = time.monotonic()
    message = call_error(tool, code="while True: pass")
    assert time.monotonic() - start < 3.5
    assert "CPU time limit" in message or "timed out" in message
    assert_still_works(tool)


def test_python_huge_allocation_fails():
    tool = PythonTool({"memory_mb": 256})
    assert "MemoryError" in call_error(tool, code="block = bytearray(10 * 2**30)")
    assert_still_works(tool)


def test_python_cannot_start_processes():
    tool = PythonTool({"wall_time_s": 5})
    before = sleep_30_pids()
    code = "import subprocess\nfor i in range(200):\n    subprocess.Popen(['sleep', '30'])"
    assert "starting processes is disabled" in call_error(tool, code=code)
    assert_no_new_sleepers(before)
    code = "import os\nfor i in range(50):\n    if os.fork() == 0:\n        os._exit(0)"
    assert "starting processes is disabled" in call_error(tool, code=code)
    code = "import _posixsubprocess\n_posixsubprocess.fork_exec()"
    assert "starting processes is disabled" in call_error(tool, code=code)
    assert "starting processes is disabled" in call_error(tool, code="import os\nos.system('true')")
    assert_still_works(tool)


def test_python_kills_the_process_group_even_without_the_audit_hook(monkeypatch):
    # The audit hook is the first line; the process group and the network namespace must hold without it.
    bootstrap = python_sandbox._BOOTSTRAP
    assert "sys.addaudithook(" in bootstrap and "_posixsubprocess.fork_exec = fork_exec" in bootstrap
    bootstrap = bootstrap.replace("sys.addaudithook(", "(lambda hook: None)(")
    monkeypatch.setattr(
        python_sandbox, "_BOOTSTRAP", bootstrap.replace("_posixsubprocess.fork_exec = fork_exec", "")
    )
    tool = PythonTool({"wall_time_s": 5, "isolation": "none"})  # isolated: tests/unit/test_python_sandbox.py
    before = sleep_30_pids()
    code = "import subprocess\nfor i in range(5):\n    subprocess.Popen(['sleep', '30'])\nprint('started')"
    start = time.monotonic()
    if os.geteuid() == 0:  # root ignores RLIMIT_NPROC: the sleepers start
        assert call(tool, code=code) == "started\n"
    else:  # RLIMIT_NPROC=0 refuses them
        assert "Resource temporarily unavailable" in call_error(tool, code=code)
    assert time.monotonic() - start < 3  # the sleepers hold the output pipe: it must not wait for them
    assert_no_new_sleepers(before)
    if os.geteuid() == 0:  # unshare(CLONE_NEWNET) works as root; elsewhere it may be refused
        code = "import socket\nsocket.socket().connect(('127.0.0.1', 9))"
        assert "Network is unreachable" in call_error(tool, code=code)


def test_python_audit_hook_refuses_writes_outside_its_directory(tmp_path):
    # the second layer alone (isolated, the host's files are not even visible: test_python_sandbox.py)
    tool = PythonTool({"isolation": "none"})
    target = tmp_path / "escaped.txt"
    message = call_error(tool, code=f"open({str(target)!r}, 'w').write('x')")
    assert "writing outside the sandbox directory is disabled" in message
    assert not target.exists()
    code = f"import os\nos.chdir({str(tmp_path)!r})\nopen('escaped.txt', 'a').write('x')"
    assert "writing outside" in call_error(tool, code=code)
    assert not target.exists()
    keep = tmp_path / "keep.txt"
    keep.write_text("keep")
    for code in (
        f"import os\nos.remove({str(keep)!r})",
        f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        f"import os\nos.chmod({str(keep)!r}, 0o777)",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\nos.open('escaped.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        f"import os\nos.symlink({str(tmp_path)!r}, 'link')",
    ):
        assert "disabled" in call_error(tool, code=code), code
    assert keep.read_text() == "keep" and not target.exists()
    # inside its own directory it may do all of that
    code = "import os, shutil\nos.mkdir('d')\nopen('d/a', 'w').write('1')\nos.rename('d/a', 'b')\nshutil.rmtree('d')\nprint(os.listdir('.'))"
    assert call(tool, code=code) == "['b']\n"
    assert call(tool, code=f"print(open({str(keep)!r}).read())") == "keep\n"  # reading stays allowed


def test_python_has_no_network():
    tool = PythonTool()
    for code in (
        "import socket\nsocket.socket().connect(('127.0.0.1', 9))",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        "import socket\nsocket.create_connection(('example.com', 80), timeout=1)",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9', timeout=1)",
    ):
        assert "network access is disabled in the sandbox" in call_error(tool, code=code), code
    # asyncio needs a local socket pair, which stays allowed
    assert call(tool, code="import asyncio\nasync def f():\n    return 7\nprint(asyncio.run(f()))") == "7\n"


def test_python_refuses_ctypes_and_raising_its_limits():
    tool = PythonTool()
    assert "ctypes is disabled" in call_error(tool, code="import ctypes\nctypes.CDLL(None).getpid()")
    code = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))"
    assert "changing resource limits is disabled" in call_error(tool, code=code)
    assert "signals to other processes" in call_error(tool, code="import os\nos.kill(1, 0)")


def test_python_unisolated_runs_in_a_fresh_directory_that_is_removed():
    tool = PythonTool({"isolation": "none"})  # isolated, the directory is a tmpfs: test_python_sandbox.py
    first = call(tool, code="import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd())").strip()
    second = call(tool, code="import os\nprint(os.getcwd(), os.listdir('.'), os.environ['HOME'])").split()
    assert first != second[0] and second[1] == "[]" and second[2] == second[0]
    assert not os.path.exists(first) and not os.path.exists(second[0])
    # also after a timeout
    tool = PythonTool({"wall_time_s": 1, "isolation": "none"})
    message = call_error(tool, code="import os, time\nprint(os.getcwd(), flush=True)\ntime.sleep(100)")
    assert not os.path.exists(message.splitlines()[1].strip())


def test_python_wall_timeout_kills_a_sleeping_program():
    tool = PythonTool({"wall_time_s": 2})
    start = time.monotonic()
    message = call_error(tool, code="print('started')\nimport time\ntime.sleep(100)")
    assert time.monotonic() - start < 5
    assert message == "timed out after 2 s:\nstarted"  # what it printed before the limit comes along
    assert_still_works(tool)


def test_python_calls_run_concurrently():
    tool = PythonTool({"max_concurrency": 4})

    async def many():
        return await asyncio.gather(*(tool.execute(f"t{i}", {"code": f"print({i} * {i})"}) for i in range(6)))

    assert [response.text for response, _, _ in asyncio.run(many())] == [f"{i * i}\n" for i in range(6)]


def test_python_config_is_checked():
    with pytest.raises(ValueError, match="unknown config keys"):
        PythonTool({"cpu_seconds": 3})
    with pytest.raises(ValueError, match="wall_time_s must be a positive number"):
        PythonTool({"wall_time_s": "10"})
    schema = OpenAIFunctionToolSchema("run_python", "run code", PYTHON_SCHEMA["function"]["parameters"])
    assert PythonTool({"type": "native"}, schema).name == "run_python"
