"""The task_struct offsets the BPF programs are compiled with, read from the running kernel's BTF
(receivers/profiling/kernel/btf.py) once per path however many receivers start."""

from __future__ import annotations

import os

import pytest

from receivers.profiling.kernel import btf


def test_a_missing_btf_says_where_it_looked_for_every_member(tmp_path):
    missing = str(tmp_path / "vmlinux")
    for read in (btf.task_fsbase_offset, btf.task_pid_offset, btf.task_tgid_offset, btf.task_start_offsets, btf.file_device_offsets):
        with pytest.raises(btf.BtfError, match="cannot read the kernel's BTF"):
            read(missing)


def test_not_btf_is_refused(tmp_path):
    garbage = tmp_path / "vmlinux"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(btf.BtfError, match="not BTF"):
        btf.task_pid_offset(str(garbage))


@pytest.mark.skipif(not os.path.exists(btf.VMLINUX_BTF), reason="this kernel exposes no BTF")
def test_the_offsets_are_the_running_kernels_and_read_once():
    btf._kernel_offsets.cache_clear()
    parsed = btf.Btf.of_running_kernel()
    assert btf.task_pid_offset() == parsed.member_offset("task_struct", "pid")
    assert btf.task_tgid_offset() == parsed.member_offset("task_struct", "tgid")
    assert btf.task_fsbase_offset() == parsed.member_offset("task_struct", "thread.fsbase")
    assert btf.task_start_offsets() == (parsed.member_offset("task_struct", "group_leader"), parsed.member_offset("task_struct", "start_boottime"))
    assert btf.task_pid_offset() != btf.task_tgid_offset()  # (pid and tgid are two fields)
    assert btf.file_device_offsets() == {flag: parsed.member_offset(struct, member) for flag, struct, member in btf.FILE_DEVICE_MEMBERS}
    assert btf._kernel_offsets.cache_info().misses == 1
