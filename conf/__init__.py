"""The config files that ship with mq, installed as the package `mq.conf` (setup.py maps
this directory to it, as it maps tools/ to mq.tools), so an installed wheel has them too:

    broker.conf, namesrv.properties   the single-broker defaults (RocketMQ's properties files)
    <layout>/*.properties, *.conf     multi-broker layouts for one machine: 2m-2s-async,
                                      2m-2s-sync, 2m-noslave, dledger (one file a broker;
                                      `python -m mq.cli.local LAYOUT` starts them all)
    systemd/*.service                 units for mqnamesrv and mqbroker
    grafana/*.json                    a Grafana dashboard of the broker's /metrics (metricsPort)

Find them through this package, never relative to a checkout: path("broker.conf"),
layouts(), layout_files("2m-2s-async")."""
from __future__ import annotations

import os

#: the directory holding the files (conf/ in a checkout or an editable install, mq/conf/ in a wheel)
DIR = os.path.dirname(os.path.abspath(__file__))


def path(*parts: str) -> str:
    """The absolute path of a shipped file, e.g. path("systemd", "mqbroker.service")."""
    return os.path.join(DIR, *parts)


#: the names a broker's file in a layout directory ends with
BROKER_FILE_SUFFIXES = (".properties", ".conf")


def layouts() -> list[str]:
    """The names of the shipped layouts: the subdirectories holding broker files."""
    return sorted(name for name in os.listdir(DIR) if os.path.isdir(path(name)) and layout_files(name))


def layout_files(name: str) -> list[str]:
    """The absolute paths of the broker files of layout `name`, sorted by file name; none if
    there is no such layout."""
    d = path(name)
    if not (name and os.path.isdir(d) and os.path.dirname(os.path.normpath(d)) == DIR):
        return []
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(BROKER_FILE_SUFFIXES)]
