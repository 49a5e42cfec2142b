"""The program the python tool's child runs before the model's code, with its audit hook.

:data:`_BOOTSTRAP` is source text: :class:`verl.tools.python_sandbox.PythonTool` passes it to the child as
``python -I -B -c <bootstrap> <limits as JSON>``, so it imports nothing of verl and defines all it uses
itself (``_sandbox`` sets the limits and installs the hook that ``_make_hook`` builds; the rest runs the
code read from stdin). What it does: the module docstring of :mod:`verl.tools.python_sandbox`."""

# Runs in the child before the model's code; argv[1] is a JSON object of limits. Everything it needs is
# bound before the audit hook is installed, and the hook only calls functions captured in its closure and a
# private copy of the builtins, so the code cannot disarm it by patching modules.
_BOOTSTRAP = r"""
import builtins, json, os, resource, sys, types

def _sandbox():
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(0, "r", closefd=False)
    sys.argv = ["<code>"]
    sys.dont_write_bytecode = True
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)

    if not cfg["isolated"]:  # under bubblewrap the network namespace is there already
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        clone_newnet, clone_newuser = 0x40000000, 0x10000000
        if libc.unshare(clone_newnet) != 0:
            libc.unshare(clone_newnet | clone_newuser)
        del libc

    def limit(which, soft, hard=None):
        hard = soft if hard is None else hard
        try:
            current = resource.getrlimit(which)[1]
            if current != resource.RLIM_INFINITY:
                soft, hard = min(soft, current), min(hard, current)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass

    limit(resource.RLIMIT_CPU, cfg["cpu"], cfg["cpu"] + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
    limit(resource.RLIMIT_AS, cfg["memory"])
    limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    limit(resource.RLIMIT_NOFILE, 64)
    limit(resource.RLIMIT_CORE, 0)
    if os.geteuid() != 0 and not cfg["isolated"]:  # isolated, the seccomp filter refuses new processes
        limit(resource.RLIMIT_NPROC, 0)

    # subprocess starts children through _posixsubprocess.fork_exec, which raises no audit event itself.
    import _posixsubprocess

    def fork_exec(*args, **kwargs):
        raise PermissionError("starting processes is disabled in the sandbox")

    _posixsubprocess.fork_exec = fork_exec

    import posix, _stat
    hook = _make_hook(cfg["root"], os.getpid(), os.getpgrp(), posix.getcwd, posix.readlink, posix.stat,
                      posix.fspath, _stat.S_ISDIR)
    private = {"__builtins__": dict(vars(builtins))}
    sys.addaudithook(types.FunctionType(hook.__code__, private, "audit_hook", None, hook.__closure__))
    del hook, private
    return code


def _make_hook(root, pid, pgid, getcwd, readlink, stat, fspath, isdir):
    network = "network access is disabled in the sandbox"
    process = "starting processes is disabled in the sandbox"
    write_flags = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000  # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND
    exact = {
        "os.system": process, "os.exec": process, "os.fork": process, "os.forkpty": process,
        "os.posix_spawn": process, "os.spawn": process, "pty.spawn": process, "subprocess.Popen": process,
        "os.startfile": process,
        # a link's target is resolved when followed, so a link inside could point anywhere
        "os.symlink": "symbolic links are disabled in the sandbox",
        "socket.bind": network, "socket.connect": network, "socket.getaddrinfo": network,
        "socket.gethostbyname": network, "socket.gethostbyaddr": network, "socket.getnameinfo": network,
        "socket.sendto": network, "socket.sendmsg": network, "socket.sethostname": network,
        "resource.setrlimit": "changing resource limits is disabled in the sandbox",
        "resource.prlimit": "changing resource limits is disabled in the sandbox",
        "gc.get_objects": "gc object walks are disabled in the sandbox",
        "gc.get_referrers": "gc object walks are disabled in the sandbox",
        "gc.get_referents": "gc object walks are disabled in the sandbox",
        "sys._current_frames": "inspecting other threads is disabled in the sandbox",
        "sqlite3.enable_load_extension": "loading native extensions is disabled in the sandbox",
        "sqlite3.load_extension": "loading native extensions is disabled in the sandbox",
    }
    # event -> positions of (path, dir_fd) pairs it changes
    writes = {
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
        "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
        "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
        "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "os.chflags": ((0, None),),
        "os.lchflags": ((0, None),), "shutil.rmtree": ((0, 1),), "shutil.chown": ((0, None),),
        "sqlite3.connect": ((0, None),),
    }

    def absolute(path, dir_fd):
        if type(path) is not str and type(path) is not bytes:
            path = fspath(path)
        if type(path) is bytes:
            path = path.decode("utf-8", "surrogateescape")
        if not path.startswith("/"):
            if dir_fd is None or dir_fd == -1 or dir_fd == -100:  # -100: AT_FDCWD
                base = getcwd()
            else:
                base = readlink("/proc/self/fd/%d" % dir_fd)
            path = base + "/" + path
        parts = []
        for part in path.split("/"):
            if part == "" or part == ".":
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        return "/" + "/".join(parts)

    def inside(path):
        return path == root or path.startswith(root + "/")

    def refuse_outside(path, dir_fd, what):
        if type(path) is int:
            # an open file descriptor: chmod/chown/utime work even on one opened read-only
            if what != "os.truncate":
                raise PermissionError("%s on a file descriptor is disabled in the sandbox" % what)
            return
        if what == "sqlite3.connect" and (path == ":memory:" or path == "" or path == b":memory:"):
            return
        target = absolute(path, dir_fd)
        if not inside(target):
            raise PermissionError("writing outside the sandbox directory is disabled: %r" % target)

    def hook(event, args):
        message = exact.get(event)
        if message is not None:
            raise PermissionError(message)
        if event == "open":
            path, mode, flags = args
            if type(path) is int:
                return
            writing = (type(mode) is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                type(flags) is int and flags & write_flags
            )
            target = absolute(path, None)
            if inside(target):
                return
            if writing:
                if target == "/dev/null":
                    return
                raise PermissionError("writing outside the sandbox directory is disabled: %r" % target)
            # a directory fd would let os.open(name, dir_fd=fd) write outside, and the open event does not
            # carry dir_fd
            try:
                is_dir = isdir(stat(target).st_mode)
            except OSError:
                return
            if is_dir and mode is None:
                raise PermissionError("opening directories outside the sandbox directory is disabled")
            return
        if event == "socket.__new__":
            if args[1] != 1:  # AF_UNIX only: asyncio's event loop needs a socket pair
                raise PermissionError(network)
            return
        if event.startswith("ctypes."):
            raise PermissionError("ctypes is disabled in the sandbox")
        if event == "import" and args[0] == "_posixsubprocess":
            raise PermissionError(process)
        if event == "os.kill":
            if args[0] != pid and args[0] != 0:
                raise PermissionError("sending signals to other processes is disabled in the sandbox")
            return
        if event == "os.killpg":
            if args[0] != pgid:
                raise PermissionError("sending signals to other processes is disabled in the sandbox")
            return
        positions = writes.get(event)
        if positions is not None:
            for path_at, fd_at in positions:
                dir_fd = args[fd_at] if fd_at is not None and fd_at < len(args) else None
                refuse_outside(args[path_at], dir_fd, event)

    return hook


_code = _sandbox()
del _sandbox, _make_hook
import linecache, traceback
linecache.cache["<code>"] = (len(_code), None, _code.splitlines(True), "<code>")  # source lines in tracebacks
_main = types.ModuleType("__main__")
_main.__builtins__ = builtins
sys.modules["__main__"] = _main
try:
    exec(compile(_code, "<code>", "exec"), _main.__dict__)
except SystemExit:
    raise
except BaseException as _error:
    # the traceback as the code alone would print it: without the frames of this file and its audit hook
    _top = traceback.TracebackException(type(_error), _error, _error.__traceback__, compact=True)
    _report, _seen = _top, set()
    while _report is not None and id(_report) not in _seen:
        _seen.add(id(_report))
        _report.stack = traceback.StackSummary.from_list([f for f in _report.stack if f.filename != "<string>"])
        _report = _report.__cause__ or _report.__context__
    sys.stderr.write("".join(_top.format()))
    sys.exit(1)
"""
