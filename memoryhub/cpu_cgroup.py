"""The runner's own CPU cgroup, so that the niceness memoryhub gives its work counts under Linux's
autogroup (docs/architecture.md §5.7 "CPU priority", docs/production.md §3 "Under floods").

With autogroup (`kernel.sched_autogroup_enabled`, on in Debian's kernels) the scheduler weighs each
session as one group, whatever its processes' niceness, and every PostgreSQL backend leads a session
of its own: a bulk request's thread at niceness 10 still takes an equal share of the web server's
group, and a lowered backend or worker gets as much as any reader's backend. Autogroup applies only
to processes in the root CPU cgroup, though. A service that systemd or a container runs is in a
cgroup of its own already, where each thread is weighed by its niceness; the runner (`make run`),
started from a shell, usually is not. So, before it starts anything, the runner moves itself into a
child CPU cgroup of its own (`memoryhub-<pid>`), where everything it then starts lands too, and
removes it when it stops. The cgroup keeps the kernel's default weight: against the machine's other
work, the service as a whole weighs what one session did.

Only when asked (`RUNNER_CPU_CGROUP=true`), and only where it changes something and is allowed:
autogroup on, this process in the root CPU cgroup, and the cgroup file system writable (root).
Cgroup v1's `cpu` hierarchy, or v2 with the `cpu` controller. Off by default: it keeps a flooding
school's bulk work from its readers' cores, but the everyday load of many agents ran slower with
every thread weighed on its own than with autogroup's sessions (docs/architecture.md §5.7).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PREFIX = "memoryhub-"


def _cpu_membership(pid: int | str) -> tuple[int, str]:
    """The cgroup version whose hierarchy holds process `pid`'s CPU cgroup (1: the cpu controller's
    own, 2: the unified one), and that cgroup's path from the hierarchy's root."""
    memberships = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    v1 = [path for _hierarchy, controllers, path in memberships if "cpu" in controllers.split(",")]
    v2 = [path for hierarchy, _controllers, path in memberships if hierarchy == "0"]
    return (1, v1[0]) if v1 else (2, (v2 or ["/"])[0])


def cpu_cgroup_path(pid: int | str = "self") -> str:
    """The CPU cgroup process `pid` is in, as a path from its hierarchy's root ("/": the root)."""
    return _cpu_membership(pid)[1]


def autogroup_on() -> bool:
    """Whether the kernel weighs sessions as groups (`kernel.sched_autogroup_enabled`)."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    return False


def _cpu_mount(version: int) -> Path | None:
    """Where the hierarchy holding the cpu controller is mounted (`version` 1 or 2), if whole."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        root, mount_point = fields.split()[3:5]
        fs_type, _source, options = [*fs.split(), "", ""][:3]
        if root != "/":
            continue  # a container's view of part of a hierarchy: not the root cgroup
        if version == 1 and fs_type == "cgroup" and "cpu" in options.split(","):
            return Path(mount_point)
        if version == 2 and fs_type == "cgroup2":
            return Path(mount_point)
    return None


def root_cpu_cgroup() -> Path | None:
    """The root CPU cgroup's directory when this process is in it, else None."""
    version, path = _cpu_membership("self")
    if path != "/":
        return None
    mount = _cpu_mount(version)
    if version == 2 and mount is not None and "cpu" not in (mount / "cgroup.controllers").read_text().split():
        return None  # the unified hierarchy without the controller
    return mount


def _remove_stale(root: Path) -> None:
    """Remove the cgroups of runners that are gone (killed before they could remove their own)."""
    for group in root.glob(f"{PREFIX}*"):
        pid = group.name.removeprefix(PREFIX)
        alive = pid.isdigit() and Path(f"/proc/{pid}").exists()
        if not alive:
            with contextlib.suppress(OSError):
                group.rmdir()  # refused while a process is still in it: then it stays


def enter_own_cpu_cgroup() -> Path | None:
    """Move this process into a CPU cgroup of its own; its path, or None where that would change
    nothing or is not allowed. Call before starting any child; `leave_cpu_cgroup` at the end."""
    if not autogroup_on():
        return None
    try:
        root = root_cpu_cgroup()
        if root is None or not os.access(root, os.W_OK):
            return None
        _remove_stale(root)
        if (root / "cgroup.subtree_control").exists():  # v2: the root hands the controller down
            (root / "cgroup.subtree_control").write_text("+cpu\n")
        group = root / f"{PREFIX}{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError:
        return None
    return group


def leave_cpu_cgroup(group: Path | None) -> None:
    """Move this process back to the root cgroup and remove `group` once its other processes are gone
    (best effort: a child still exiting leaves it to the next runner's clean-up)."""
    if group is None:
        return
    with contextlib.suppress(OSError):
        (group.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
        group.rmdir()
