#!/usr/bin/env python3
"""Checks on compiled device code, used by the CTest device checks (cmake/Dsv4DeviceCheck.cmake).

  run-to-log LOG -- CMD...            run CMD, write its stdout+stderr to LOG, exit with its status
  expect-instruction INSN FILE...     every FILE contains INSN
  expect-no-instruction INSN FILE...  no FILE contains INSN
  amd-no-spills FILE...               AMDGPU asm metadata: no private segment (scratch), no VGPR/SGPR spills
  ptxas-no-spills LOG...              `ptxas -v` logs: no spill stores/loads and no stack frame
  amd-scale-operands-in-vgprs FILE... every gfx950 block-scaled MFMA takes both scale bytes from VGPRs
                                      (from an SGPR or a constant the unit reads bits [30:23] instead)
"""
import re
import subprocess
import sys


def run_to_log(args):
    log, sep, *cmd = args
    assert sep == "--", "usage: run-to-log LOG -- CMD..."
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as f:
        f.write(proc.stdout)
    if proc.returncode:
        sys.stderr.write(proc.stdout)
    return proc.returncode


def check_presence(args, wanted):
    """Every FILE contains INSN (wanted) or none does (not wanted)."""
    insn, *files = args
    wrong = [f for f in files if (insn in open(f).read()) != wanted]
    for f in wrong:
        print(f"{f}: {'no' if wanted else 'has'} '{insn}'")
    print(f"'{insn}' {'present in' if wanted else 'absent from'} {len(files) - len(wrong)}/{len(files)} files")
    return 1 if wrong or not files else 0


def expect_instruction(args):
    return check_presence(args, True)


def expect_no_instruction(args):
    return check_presence(args, False)


AMD_FIELDS = {
    ".private_segment_fixed_size": "scratch bytes",
    ".vgpr_spill_count": "VGPR spills",
    ".sgpr_spill_count": "SGPR spills",
}


def amd_no_spills(files):
    bad = 0
    kernels = 0
    for f in files:
        text = open(f).read()
        kernels += text.count(".vgpr_spill_count:")
        for field, what in AMD_FIELDS.items():
            for value in re.findall(re.escape(field) + r":\s*(\d+)", text):
                if int(value):
                    print(f"{f}: {what} = {value}")
                    bad += 1
    print(f"{kernels} kernels checked in {len(files)} files, {bad} problems")
    return 1 if bad or not kernels else 0


def ptxas_no_spills(logs):
    bad = 0
    functions = 0
    for log in logs:
        text = open(log).read()
        functions += len(re.findall(r"Compiling entry function", text))
        for stores, loads in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text):
            if int(stores) or int(loads):
                print(f"{log}: {stores} bytes spill stores, {loads} bytes spill loads")
                bad += 1
        for frame in re.findall(r"(\d+) bytes stack frame", text):
            if int(frame):
                print(f"{log}: {frame} bytes stack frame")
                bad += 1
    print(f"{functions} entry functions checked in {len(logs)} logs, {bad} problems")
    return 1 if bad or not functions else 0


SCALED_MFMA = re.compile(r"^\s*(v_mfma_scale_\S+)\s+(.*?)(\s+op_sel\S*.*)?$")


def amd_scale_operands_in_vgprs(files):
    bad = 0
    found = 0
    for f in files:
        for line in open(f):
            match = SCALED_MFMA.match(line)
            if not match:
                continue
            found += 1
            operands = [o.strip() for o in match.group(2).split(",")]
            scales = operands[4:6]
            if len(scales) != 2 or not all(re.fullmatch(r"v\d+", o) for o in scales):
                print(f"{f}: scale operands {scales} not VGPRs: {line.strip()}")
                bad += 1
    print(f"{found} block-scaled MFMAs checked in {len(files)} files, {bad} problems")
    return 1 if bad or not found else 0


def main(argv):
    commands = {
        "run-to-log": run_to_log,
        "expect-instruction": expect_instruction,
        "expect-no-instruction": expect_no_instruction,
        "amd-no-spills": amd_no_spills,
        "ptxas-no-spills": ptxas_no_spills,
        "amd-scale-operands-in-vgprs": amd_scale_operands_in_vgprs,
    }
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__)
        return 2
    return commands[argv[1]](argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
