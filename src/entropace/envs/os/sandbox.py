"""Run one shell command in a bubblewrap (``bwrap``) sandbox against a copied-in work tree.

Design (why one sandbox per command, and why the state travels as a tar stream):

* Every command gets a **fresh** ``bwrap`` sandbox: all namespaces unshared (no network: only
  the sandbox's own loopback exists), ``--die-with-parent``, ``--new-session``, every capability
  dropped, the host's ``/usr`` bound read-only (``/bin``, ``/lib``, ``/lib64`` are symlinks into
  it), a synthetic read-only ``/etc`` (``passwd``/``group``, plus the host's ``alternatives``
  symlinks and loader cache), a fresh ``/proc`` and a
  minimal, read-only ``/dev`` (its device nodes work; no file can be made there), and a
  read-only root. The only writable paths are private, size-capped tmpfs mounts: ``/work``
  (the episode's files), ``/tmp`` (scratch, not kept; ``/dev/shm`` is a second directory of
  the same tmpfs, so the two share its caps) and ``/.io`` (the command's captured output),
  plus a 64 KiB ``/.meta`` for its exit status. A seccomp filter
  (:mod:`entropace.envs.os.seccomp`) refuses ``memfd_create``, ``shmget`` and
  ``memfd_secret``, whose memory no tmpfs cap would count.
  Further user namespaces are disabled inside (``--disable-userns``): a nested one could mount
  its own tmpfs, sized by the host's memory instead of these caps.
* The tmpfs mounts also cap **inodes** (``nr_inodes``: a flood of empty files costs kernel
  memory, not tmpfs bytes). bwrap's ``--tmpfs`` takes no inode option, so the mounts are made
  one step earlier: ``unshare --user --map-root-user --mount`` starts a private mount namespace
  (owned by an unprivileged user namespace; nothing propagates to the host), mounts the capped
  tmpfs there, and execs bwrap, which binds them in. Where that outer step cannot run, the
  sandbox falls back to bwrap's own ``--tmpfs`` mounts (bytes capped, inodes not) with a
  ``RuntimeWarning``.
* The episode's state is a tar archive held in host memory. It is **copied in** on the
  sandbox's stdin and extracted into the ``/work`` tmpfs before the command runs, and copied
  back out (``tar -c`` of ``/work``) on stdout after it. Nothing on the host's disk is ever
  bind-mounted writable, the host never extracts an archive the sandbox produced (the verifier
  reads it in memory with :mod:`tarfile`), and a command that breaks the sandbox (kills its
  shell, corrupts the stream, overflows a cap) simply loses its own changes: every command is
  transactional. The host decodes the stream defensively (:func:`_decode_stream`): the capture
  files count only as regular files (a command may replace them with symlinks, FIFOs or
  directories), and a work tree that would not fit into ``/work`` when copied back in (a sparse
  file is copied back at its full size) is refused, so the episode's state always restores.
* When the sandbox ends, its PID namespace ends, so no process of a command outlives it:
  endless loops, fork bombs and ``setsid`` daemons are bounded by the per-command time limit.
  Inside, the command runs under ``timeout -s KILL`` with resource limits (``ulimit``: process
  count, address space, file size, no core files); afterwards the wrapper ``kill -KILL -1``\\ s
  whatever is left before archiving; the host enforces its own deadline on top and SIGKILLs
  the whole ``bwrap`` process group.
* RLIMIT_NPROC is not enforced for processes whose host uid is 0, so when the host process
  runs as root the sandbox is started as the unprivileged uid ``nobody`` (65534); inside, the
  agent is uid 1000 (``user``) either way.

The alternative, one long-lived bash per episode (``OsEnv(shell="persistent")``,
:mod:`entropace.envs.os.session`), keeps shell state such as ``cd``, variables and background
jobs, and uses this module's isolation options (:meth:`Sandbox.bwrap_argv`); it has to control
processes from the host instead of relying on one sandbox per command. Per-command sandboxes
stay the default: simpler, transactional guarantees for a start-up cost of tens of
milliseconds (see ``benchmarks/results/envs_os.md`` and ``benchmarks/results/envs_hardening.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import selectors
import shutil
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass

from entropace.envs.os.seccomp import filter_program
from entropace.envs.os.stream import RunResult, decode_stream

_decode_stream = decode_stream  # the name the sandbox tests use

__all__ = [
    "RunResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailableError",
    "require_bwrap",
]

MiB = 1024 * 1024
_NOBODY = 65534
_INSIDE_UID = 1000
_PASSWD = b"root:x:0:0:root:/:/usr/sbin/nologin\nuser:x:1000:1000:user:/work:/bin/bash\n"
_GROUP = b"root:x:0:\nuser:x:1000:\n"
_INSTALL_HINT = (
    "the `os` environment runs every command in a bubblewrap sandbox; install it with "
    "`apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora); "
    "see https://github.com/containers/bubblewrap"
)

# The script bwrap runs (as ``bash -c WRAPPER entropace-sandbox COMMAND``). Placeholders in
# braces are filled from SandboxLimits. The command's stdout+stderr go to a file on the capped
# /.io tmpfs, so a flood of output stops with ENOSPC instead of filling host memory. Before the
# final tar, the wrapper restores its own capture files (the command may have chmod-ed,
# replaced or removed them), so tar's exit status speaks only about /work: a non-zero one means
# a work file could not be read, and the command's changes are discarded (see stream.py).
_WRAPPER = r"""
cd /work || exit 97
tar -x -p --no-same-owner -f - -C / work || exit 98
exec </dev/null
(
  ulimit -c 0 -u {nproc} -v {mem_kb} -f {fsize_kb} 2>/dev/null
  exec timeout -s KILL {timeout_s} bash -c "$1"
) >/.io/out 2>&1
rc=$?
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  kill -KILL -1 2>/dev/null || break
done
chmod -R u+rwX /.io /.meta 2>/dev/null
if [ -h /.io/out ] || [ ! -f /.io/out ]; then rm -rf /.io/out; : >/.io/out || exit 96; fi
rm -rf /.meta/rc
echo "$rc" >/.meta/rc || exit 96
cd / && exec tar -c -f - work .io/out .meta/rc
"""


# The outer mount step: ``unshare`` runs ``bash -c _OUTER FD bwrap ...`` as root of a fresh user
# namespace in a private mount namespace; one ``mount -a`` mounts the capped tmpfs of _FSTAB
# (a memfd on fd FD, closed again before bwrap starts), then bwrap ("$@") binds them in.
# Nothing of this is visible on the host.
# The scratch tmpfs holds both /tmp and /dev/shm (two directories bwrap binds in), so the two
# share one byte and inode cap.
_OUTER = (
    'f=$0; mount -a -T "/proc/self/fd/$f" && mkdir -m 0755 /tmp/scratch/tmp /tmp/scratch/shm '
    '&& exec {f}<&- && exec "$@"'
)
SCRATCH_FSTAB = (
    "entropace-tmp /tmp/scratch tmpfs size={tmp},nr_inodes={files},mode=0755,X-mount.mkdir 0 0\n"
)
_FSTAB = (
    """\
entropace /tmp tmpfs size=65536,nr_inodes=16,mode=0755 0 0
entropace-work /tmp/work tmpfs size={work},nr_inodes={files},mode=0755,X-mount.mkdir 0 0
"""
    + SCRATCH_FSTAB
    + """\
entropace-io /tmp/io tmpfs size={out},nr_inodes=16,mode=0755,X-mount.mkdir 0 0
entropace-meta /tmp/meta tmpfs size=65536,nr_inodes=16,mode=0755,X-mount.mkdir 0 0
"""
)


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-command resource limits.

    Attributes:
        timeout_s: wall-clock limit of one command (the whole process tree is killed).
        work_bytes: size of the ``/work`` tmpfs (the episode's files).
        tmp_bytes: size of the scratch ``/tmp`` tmpfs (emptied after every command).
        output_bytes: size of the ``/.io`` tmpfs that captures stdout+stderr; output beyond it
            is lost (the writer gets ENOSPC).
        memory_bytes: address-space limit (``ulimit -v``) of every process of the command.
        max_processes: process limit (``ulimit -u``) inside the sandbox's user namespace.
        file_bytes: largest file a command may write (``ulimit -f``).
        max_command_chars: longest accepted command (longer ones are refused unrun).
        max_files: inodes of ``/work`` and of ``/tmp`` each (files, directories, symlinks;
            ``/.io`` and ``/.meta`` get 16); applied where the outer mount step is available.
        cpu_seconds: CPU time (``ulimit -t``) of every process of a persistent shell (the
            shell itself included), so a background job cannot spin for the whole episode;
            the fresh mode's commands are bounded by ``timeout_s`` instead.
    """

    timeout_s: float = 5.0
    work_bytes: int = 8 * MiB
    tmp_bytes: int = 4 * MiB
    output_bytes: int = 1 * MiB
    memory_bytes: int = 512 * MiB
    max_processes: int = 64
    file_bytes: int = 8 * MiB
    max_command_chars: int = 16_000
    max_files: int = 4096
    cpu_seconds: int = 60

    def __post_init__(self) -> None:
        if not (0 < self.timeout_s <= 600):
            raise ValueError(f"timeout_s must be in (0, 600], got {self.timeout_s}")
        for name in ("work_bytes", "tmp_bytes", "output_bytes", "memory_bytes", "file_bytes"):
            if getattr(self, name) < 64 * 1024:
                raise ValueError(f"{name} must be >= 64 KiB, got {getattr(self, name)}")
        if self.max_processes < 8:
            raise ValueError(f"max_processes must be >= 8, got {self.max_processes}")
        if self.max_command_chars < 1:
            raise ValueError(f"max_command_chars must be >= 1, got {self.max_command_chars}")
        if self.max_files < 64:
            raise ValueError(f"max_files must be >= 64, got {self.max_files}")
        if self.cpu_seconds < 1:
            raise ValueError(f"cpu_seconds must be >= 1, got {self.cpu_seconds}")

    @property
    def max_stream_bytes(self) -> int:
        """Largest tar stream read back: the work tree, the output, and tar's headers."""
        return 2 * self.work_bytes + self.output_bytes + 4 * MiB


def require_bwrap() -> tuple[str, int | None]:
    """A working ``bwrap`` and the host uid to run it as (None: the caller's own uid).

    Raises :class:`SandboxUnavailableError` naming the fix when bwrap is missing or cannot
    create a sandbox.
    """
    path, host_uid, _ = _require()
    return path, host_uid


def _require() -> tuple[str, int | None, str | None]:
    """(bwrap, host uid, ``unshare`` for the inode-capped mounts or None), probed once."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(f"bubblewrap (`bwrap`) not found on PATH: {_INSTALL_HINT}")
    unshare = shutil.which("unshare")
    host_uid, capped, problem = _probe(path, os.geteuid(), unshare)
    if problem:
        raise SandboxUnavailableError(
            f"bubblewrap cannot start a sandbox here ({problem}). It needs user namespaces: "
            "check `sysctl user.max_user_namespaces` (> 0), `kernel.unprivileged_userns_clone=1` "
            "(older Debian kernels) or `kernel.apparmor_restrict_unprivileged_userns=0` "
            "(Ubuntu >= 23.10), or run inside a container that allows them."
        )
    return path, host_uid, unshare if capped else None


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str, euid: int, unshare: str | None) -> tuple[int | None, bool, str]:
    """Start one trivial sandbox: (host uid, inode caps work, '') or (None, False, the error).

    As root, the sandbox first tries the unprivileged uid ``nobody`` (so that the process limit
    is enforced), then root itself with a warning; for each, first with the outer mount step
    (``unshare``: inode-capped tmpfs), then without it, with a warning. Cached per process.
    """
    candidates: list[int | None] = [_NOBODY, None] if euid == 0 else [None]
    problem = ""
    for host_uid in candidates:
        for outer in [unshare, None] if unshare else [None]:
            box = Sandbox(
                SandboxLimits(timeout_s=10.0), bwrap=bwrap, host_uid=host_uid, unshare=outer
            )
            result = box.run("echo ok", empty_state())
            if result.error is None and result.output == b"ok\n" and result.state is not None:
                if host_uid is None and euid == 0:
                    warnings.warn(
                        "bwrap cannot run as an unprivileged uid here; the os sandbox runs as "
                        "host root, where the kernel does not enforce its process-count limit",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                if outer is None:
                    why = "`unshare` is not installed" if not unshare else problem
                    warnings.warn(
                        "the os sandbox cannot mount inode-capped tmpfs here "
                        f"({why or 'the outer mount step failed'}); it uses bwrap's own "
                        "--tmpfs, whose size is capped but whose number of files is not",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                if not _supports(bwrap, "--disable-userns"):
                    warnings.warn(
                        f"{bwrap} has no --disable-userns (bubblewrap < 0.8): commands in the "
                        "os sandbox can create nested user namespaces, and so mount tmpfs "
                        "whose size the sandbox does not cap",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                return host_uid, outer is not None, ""
            problem = problem or result.error or f"unexpected output {result.output[:200]!r}"
    return None, False, problem


@functools.lru_cache(maxsize=8)
def _supports(bwrap: str, option: str) -> bool:
    """Whether ``bwrap --help`` lists ``option`` (cached per binary)."""
    try:
        text = subprocess.run(  # noqa: S603 - fixed argv
            [bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return option in text


def empty_state() -> bytes:
    """A tar archive holding only an empty ``work/`` directory."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("work")
        info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, _INSIDE_UID, _INSIDE_UID
        tar.addfile(info)
    return buf.getvalue()


def _data_fd(data: bytes) -> int:
    """A readable pipe already holding ``data`` (small: fits in the pipe buffer)."""
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r


def _memfd(data: bytes, name: str) -> int:
    fd = os.memfd_create(name)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Sandbox:
    """Runs commands in fresh bubblewrap sandboxes (see the module docstring).

    Args:
        limits: resource limits of every command.
        bwrap: path of the ``bwrap`` binary (default: found on PATH and probed once, which
            also picks ``host_uid`` and ``unshare``).
        host_uid: when the caller is root, the host uid to start bwrap as (None: root).
        unshare: path of util-linux ``unshare`` for the outer step that mounts the inode-capped
            tmpfs (None: bwrap's own ``--tmpfs``, inodes uncapped).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        bwrap: str | None = None,
        host_uid: int | None = None,
        unshare: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        if bwrap is None:
            # RLIMIT_NPROC is not enforced for host uid 0: as root, run bwrap as nobody.
            bwrap, host_uid, unshare = _require()
        self.bwrap = bwrap
        self.unshare = unshare
        # --disable-userns needs bubblewrap >= 0.8; older ones cannot stop nested namespaces.
        self._no_userns = ["--disable-userns"] if _supports(bwrap, "--disable-userns") else []
        self._host_uid = host_uid if os.geteuid() == 0 else None
        self._seccomp = filter_program()
        if self._seccomp is None:
            warnings.warn(
                f"the os sandbox has no seccomp filter for {platform.machine()!r}: commands can "
                "create memfds and System V shared memory outside its memory caps",
                RuntimeWarning,
                stacklevel=2,
            )

    def seccomp_fd(self) -> int | None:
        """A readable fd holding the seccomp program for bwrap's ``--seccomp`` (None: no
        filter on this architecture). The caller passes it to bwrap and closes it."""
        return None if self._seccomp is None else _data_fd(self._seccomp)

    def _argv(
        self,
        command: str,
        passwd_fd: int,
        group_fd: int,
        fstab_fd: int | None,
        seccomp_fd: int | None,
    ) -> list[str]:
        lim = self.limits
        wrapper = _WRAPPER.format(
            nproc=lim.max_processes,
            mem_kb=lim.memory_bytes // 1024,
            fsize_kb=lim.file_bytes // 1024,
            timeout_s=f"{lim.timeout_s:g}",
        )
        etc = ["--dir", "/etc"]
        data = ["--perms", "0644", "--ro-bind-data", str(passwd_fd), "/etc/passwd",
                "--perms", "0644", "--ro-bind-data", str(group_fd), "/etc/group"]  # fmt: skip
        if self.unshare is None:  # bwrap's own tmpfs: bytes capped, inodes not
            mounts = ["--size", str(lim.work_bytes), "--tmpfs", "/work",
                      "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
                      "--size", str(lim.output_bytes), "--tmpfs", "/.io",
                      "--size", "65536", "--tmpfs", "/.meta"]  # fmt: skip
        else:  # mounted by the outer step (see _OUTER), bound in by bwrap
            mounts = ["--bind", "/tmp/work", "/work", "--bind", "/tmp/scratch/tmp", "/tmp",
                      "--bind", "/tmp/io", "/.io", "--bind", "/tmp/meta", "/.meta"]  # fmt: skip
        tail = ["/usr/bin/bash", "-c", wrapper, "entropace-sandbox", command]
        return self.bwrap_argv(etc, data, mounts, tail, fstab_fd, seccomp_fd, as_pid_1=False)

    def bwrap_argv(
        self,
        etc: list[str],
        data: list[str],
        mounts: list[str],
        tail: list[str],
        fstab_fd: int | None,
        seccomp_fd: int | None,
        *,
        as_pid_1: bool,
    ) -> list[str]:
        """The full argv: the outer mount step (when ``unshare`` is used), then bwrap with the
        common isolation options, ``etc`` (how ``/etc`` is made), the host files bound into it,
        ``data`` (files made from fds), ``mounts`` (the writable tmpfs), ``/dev/shm`` (on the
        scratch tmpfs, with ``/tmp``), a read-only ``/dev``, the seccomp filter read from
        ``seccomp_fd`` (:mod:`entropace.envs.os.seccomp`; None: none), then ``tail`` (the
        program and its arguments). ``as_pid_1``: the program is the sandbox's PID 1 (no bwrap
        reaper; used by the persistent shell's supervisor)."""
        outer: list[str] = []
        if self.unshare is not None:
            outer = [self.unshare, "--user", "--map-root-user", "--mount",
                     "--propagation", "private", "--", "/usr/bin/bash", "-c", _OUTER,
                     str(fstab_fd)]  # fmt: skip
        if self.unshare is not None:  # /dev/shm shares the scratch tmpfs (and caps) with /tmp
            shm = ["--bind", "/tmp/scratch/shm", "/dev/shm"]
        else:  # its own tmpfs, capped like /tmp
            shm = ["--size", str(self.limits.tmp_bytes), "--tmpfs", "/dev/shm"]
        seccomp = [] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]
        # fmt: off
        return [
            *outer,
            self.bwrap,
            "--unshare-all", "--unshare-user", *self._no_userns,
            *(["--as-pid-1"] if as_pid_1 else []),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID),
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--proc", "/proc", "--dev", "/dev",
            *etc,
            # Debian's alternatives (awk -> mawk, ...) and the loader cache; nothing else of /etc.
            "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            *data,
            *mounts,
            *shm,
            "--remount-ro", "/dev",
            "--remount-ro", "/",
            *seccomp,
            "--chdir", "/work",
            "--clearenv",
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/work",
            "--setenv", "USER", "user", "--setenv", "LC_ALL", "C", "--setenv", "TERM", "dumb",
            "--",
            *tail,
        ]
        # fmt: on

    def run(self, command: str, state: bytes) -> RunResult:
        """Run ``command`` with ``/work`` restored from ``state`` (a tar with a ``work/`` root).

        Never raises on a bad command; a command containing NUL or longer than
        ``max_command_chars`` is refused unrun (``error`` says so, ``state`` is None).
        """
        start = time.monotonic()
        if "\x00" in command:
            return RunResult(b"", None, False, None, "the command contains a NUL byte", 0.0)
        if len(command) > self.limits.max_command_chars:
            msg = f"the command is {len(command)} characters; the limit is "
            msg += f"{self.limits.max_command_chars}"
            return RunResult(b"", None, False, None, msg, 0.0)
        passwd_fd, group_fd = _data_fd(_PASSWD), _data_fd(_GROUP)
        lim = self.limits
        fstab = _FSTAB.format(
            work=lim.work_bytes, tmp=lim.tmp_bytes, out=lim.output_bytes, files=lim.max_files
        )
        fstab_fd = _memfd(fstab.encode(), "entropace-fstab") if self.unshare else None
        seccomp_fd = self.seccomp_fd()
        fds = tuple(fd for fd in (passwd_fd, group_fd, fstab_fd, seccomp_fd) if fd is not None)
        stdin_fd = _memfd(state, "entropace-state")
        stderr_fd = os.memfd_create("entropace-stderr")
        kwargs: dict[str, object] = {}
        if self._host_uid is not None:
            kwargs = {"user": self._host_uid, "group": self._host_uid, "extra_groups": []}
        try:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv, the command runs in the sandbox
                self._argv(command, passwd_fd, group_fd, fstab_fd, seccomp_fd),
                stdin=stdin_fd,
                stdout=subprocess.PIPE,
                stderr=stderr_fd,
                pass_fds=fds,
                start_new_session=True,
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                **kwargs,  # type: ignore[arg-type]
            )
        except OSError as exc:
            for fd in (*fds, stdin_fd, stderr_fd):
                os.close(fd)
            return RunResult(b"", None, False, None, f"could not start bwrap: {exc}", 0.0)
        for fd in (*fds, stdin_fd):
            os.close(fd)
        stream, timed_out, overflow = self._read_capped(proc)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # stdout closed but bwrap lingers: end it
            _kill_group(proc)
            proc.wait()
        os.lseek(stderr_fd, 0, os.SEEK_SET)
        stderr = os.read(stderr_fd, 4096)
        os.close(stderr_fd)
        seconds = time.monotonic() - start
        if timed_out:
            return RunResult(b"", 137, True, None, "the sandbox exceeded its time limit", seconds)
        if overflow:
            msg = "the work directory grew past the size limit"
            return RunResult(b"", None, False, None, msg, seconds)
        result = _decode_stream(
            stream, proc.returncode, stderr, seconds, work_bytes=self.limits.work_bytes
        )
        # 137 is SIGKILL; it is the time limit only if the command ran that long.
        timed_out = result.exit_code == 137 and seconds >= self.limits.timeout_s
        return dataclasses.replace(result, timed_out=timed_out)

    def _read_capped(self, proc: subprocess.Popen[bytes]) -> tuple[bytes, bool, bool]:
        """Read stdout until EOF, the host deadline, or the size cap (then kill the group)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.limits.timeout_s + 5.0
        cap = self.limits.max_stream_bytes
        chunks: list[bytes] = []
        total = 0
        timed_out = overflow = False
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                if not sel.select(remaining):
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                total += len(data)
                if total > cap:
                    overflow = True
                    break
                chunks.append(data)
        if timed_out or overflow:
            _kill_group(proc)
        proc.stdout.close()
        return b"".join(chunks), timed_out, overflow


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's process group (the sandbox dies with it: ``--die-with-parent``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
