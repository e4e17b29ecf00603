"""systemd units for this installation, wherever it is: `python -m mq.conf.systemd`.

The shipped units (mqbroker.service, mqnamesrv.service, next to this file) document one layout,
a checkout in /opt/mq with its venv (tests/ops/test_systemd_units.py keeps them to it).  An
installation from a wheel has its console scripts elsewhere: in the venv's bin/, in
/usr/local/bin, in ~/.local/bin.  This writes the same units with ExecStart= pointing at the
mqbroker and mqnamesrv of the interpreter that runs it:

    sudo /path/to/venv/bin/python -m mq.conf.systemd                 # -> /etc/systemd/system
    python -m mq.conf.systemd --dest DIR [--bin-dir DIR] [--config-dir /etc/mq] [--with-config]

  --dest DIR        where the .service files go (/etc/systemd/system)
  --bin-dir DIR     the directory of mqbroker and mqnamesrv (found from this interpreter: its
                    scripts directory, the directory of the interpreter, the user scheme's)
  --config-dir DIR  where the units' -c files are (/etc/mq: broker.conf, namesrv.properties)
  --with-config     also copy the shipped broker.conf and namesrv.properties there, unless a
                    file of that name exists (never overwritten)

Every other line of the units is the shipped one.  Exit codes: 0 written; 1 the console scripts
are not found or a file cannot be written; 2 bad command line."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig

UNITS = ("mqnamesrv", "mqbroker")
SHIPPED_BIN = "/opt/mq/.venv/bin/"          # the layout the shipped units document
SHIPPED_CONFIG_DIR = "/etc/mq/"
CONFIG_FILES = {"mqbroker": "broker.conf", "mqnamesrv": "namesrv.properties"}
HERE = os.path.dirname(os.path.abspath(__file__))


def find_bin_dir() -> str | None:
    """The directory holding this installation's mqbroker and mqnamesrv, or None."""
    candidates = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    try:
        candidates.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    for d in candidates:
        if d and all(os.access(os.path.join(d, name), os.X_OK) for name in UNITS):
            return os.path.abspath(d)
    return None


def render(name: str, bin_dir: str, config_dir: str = SHIPPED_CONFIG_DIR) -> str:
    """The shipped unit `name` (mqbroker, mqnamesrv) with its commands in `bin_dir` and its
    config file in `config_dir`; the header says where it came from."""
    with open(os.path.join(HERE, f"{name}.service"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    bin_dir = os.path.join(os.path.abspath(bin_dir), "")
    config_dir = os.path.join(config_dir, "")
    out, skipping = [], False
    for line in lines:
        if line.startswith("#   /opt/mq"):          # the checkout paragraph: this installation instead
            out.append(f"#   {bin_dir:<24}the {', '.join(UNITS)} commands of the installation this unit was")
            out.append(f"#   {'':<24}written for (by `python -m mq.conf.systemd`)")
            skipping = True
            continue
        if skipping and line.startswith("#" + " " * 10):
            continue                                # the paragraph's continuation lines
        skipping = False
        if line.startswith("# Install: cp conf/systemd/"):
            out.append("# Install: written by `python -m mq.conf.systemd`; then systemctl daemon-reload &&")
            continue
        out.append(line.replace(SHIPPED_BIN, bin_dir).replace(SHIPPED_CONFIG_DIR, config_dir))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mq.conf.systemd",
                                 description="Write mqnamesrv.service and mqbroker.service for this installation")
    ap.add_argument("--dest", default="/etc/systemd/system", help="directory of the units (/etc/systemd/system)")
    ap.add_argument("--bin-dir", help="directory of mqbroker and mqnamesrv (this installation's)")
    ap.add_argument("--config-dir", default="/etc/mq", help="directory of broker.conf and namesrv.properties")
    ap.add_argument("--with-config", action="store_true", help="copy the shipped config files there if absent")
    args = ap.parse_args(argv)
    bin_dir = args.bin_dir or find_bin_dir()
    if bin_dir is None or not all(os.access(os.path.join(bin_dir, n), os.X_OK) for n in UNITS):
        print(f"mq.conf.systemd: no {' and '.join(UNITS)} found{' in ' + bin_dir if bin_dir else ''}: "
              "run it with the python of the installation, or give --bin-dir", file=sys.stderr)
        return 1
    try:
        os.makedirs(args.dest, exist_ok=True)
        for name in UNITS:
            path = os.path.join(args.dest, f"{name}.service")
            with open(path, "w", encoding="utf-8") as f:
                f.write(render(name, bin_dir, args.config_dir))
            print(f"wrote {path} (ExecStart={os.path.join(bin_dir, name)})")
        if args.with_config:
            os.makedirs(args.config_dir, exist_ok=True)
            for name in UNITS:
                dst = os.path.join(args.config_dir, CONFIG_FILES[name])
                if os.path.exists(dst):
                    print(f"kept {dst} (exists)")
                else:
                    shutil.copyfile(os.path.join(os.path.dirname(HERE), CONFIG_FILES[name]), dst)
                    print(f"wrote {dst}")
    except OSError as e:
        print(f"mq.conf.systemd: {e}", file=sys.stderr)
        return 1
    print("next: useradd --system --home-dir /var/lib/mq --shell /usr/sbin/nologin mq (once); "
          "systemctl daemon-reload && systemctl enable --now mqnamesrv mqbroker")
    return 0
