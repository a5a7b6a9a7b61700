"""An I/O wait's device by name (receivers/profiling/waits/devices.py): a block device's kernel
name, a file system on none by its mount's source, the number when neither is found."""

from __future__ import annotations

from pathlib import Path

from receivers.profiling.waits.devices import CACHE_SECONDS, DeviceNames


def kernel_dev(major: int, minor: int) -> int:
    return major << 20 | minor


def fake_host(tmp_path: Path) -> tuple[str, Path]:
    block = tmp_path / "sys" / "dev" / "block"
    for (major, minor), name in {(254, 0): "vda", (259, 3): "nvme0n1p2", (253, 0): "dm-0"}.items():
        (block / f"{major}:{minor}").mkdir(parents=True)
        (block / f"{major}:{minor}" / "uevent").write_text(f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\nDEVTYPE=disk\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 27 0:53 / /mnt/data rw,relatime shared:7 master:1 - nfs4 files.example:/export/data rw,vers=4.2\n"
        "41 27 0:54 / /mnt/odd\\040name rw - fuse.sshfs me@host:/a\\040dir rw\n")
    return str(tmp_path / "sys"), mountinfo


def test_block_devices_by_their_kernel_name(tmp_path):
    sys_root, mountinfo = fake_host(tmp_path)
    names = DeviceNames(sys_root, str(mountinfo))
    assert names.name(kernel_dev(254, 0)) == "vda"
    assert names.name(kernel_dev(259, 3)) == "nvme0n1p2"
    assert names.name(kernel_dev(253, 0)) == "dm-0"


def test_file_systems_on_no_block_device_by_their_mount_source(tmp_path):
    """(optional fields before the separator in any number; octal escapes undone)"""
    sys_root, mountinfo = fake_host(tmp_path)
    names = DeviceNames(sys_root, str(mountinfo))
    assert names.name(kernel_dev(0, 53)) == "files.example:/export/data"
    assert names.name(kernel_dev(0, 54)) == "me@host:/a dir"


def test_a_device_found_nowhere_is_its_number(tmp_path):
    sys_root, mountinfo = fake_host(tmp_path)
    names = DeviceNames(sys_root, str(mountinfo))
    assert names.name(kernel_dev(8, 17)) == "8:17"
    assert names.name(kernel_dev(0, 99)) == "0:99"
    assert DeviceNames(str(tmp_path / "none"), str(tmp_path / "none")).name(kernel_dev(254, 0)) == "254:0"


def test_names_are_read_again_after_a_while(tmp_path):
    """A device number is reused (a loop device detached, another attached): the cache ages out."""
    sys_root, mountinfo = fake_host(tmp_path)
    now = [0.0]
    names = DeviceNames(sys_root, str(mountinfo), clock=lambda: now[0])
    assert names.name(kernel_dev(254, 0)) == "vda"
    (tmp_path / "sys" / "dev" / "block" / "254:0" / "uevent").write_text("MAJOR=254\nMINOR=0\nDEVNAME=vdz\n")
    assert names.name(kernel_dev(254, 0)) == "vda"
    now[0] += CACHE_SECONDS + 1
    assert names.name(kernel_dev(254, 0)) == "vdz"


def test_this_hosts_root_file_system(tmp_path):
    """The real files: the device of / by the name /sys/dev/block's link gives it."""
    import os
    st = os.stat("/")
    link = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not link.exists():
        return
    assert DeviceNames().name(kernel_dev(os.major(st.st_dev), os.minor(st.st_dev))) == link.resolve().name
