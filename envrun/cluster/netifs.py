"""A host's network interfaces and their addresses, and the Ascend paths it has: standard library only.

Run by the image's ``python3`` in two places: ``envrun cluster up``'s host probe (this file's source, with
the host's paths bound under ``/host`` and host networking: ``python3 -c SOURCE PATTERNS``) and a node's
own check (imported by :mod:`envrun.cluster.onnode`). Addresses come from ``getifaddrs(3)`` through
ctypes: every address of every interface, secondary ones too (no ``ip`` binary in an image is assumed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import ipaddress
import json
import socket
import sys
from collections.abc import Mapping
from typing import Any


class _Sockaddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 14)]


class _Sockaddr4(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16), ("addr", ctypes.c_ubyte * 4)]


class _Sockaddr6(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_ushort),
        ("port", ctypes.c_uint16),
        ("flowinfo", ctypes.c_uint32),
        ("addr", ctypes.c_ubyte * 16),
        ("scope_id", ctypes.c_uint32),
    ]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [
    ("next", ctypes.POINTER(_Ifaddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.POINTER(_Sockaddr)),
    ("netmask", ctypes.POINTER(_Sockaddr)),
    ("ifu", ctypes.POINTER(_Sockaddr)),
    ("data", ctypes.c_void_p),
]


def _raw(pointer: Any) -> bytes | None:
    """An IPv4 or IPv6 socket address's bytes (None for another family, or none)."""
    if not pointer:
        return None
    family = pointer.contents.family
    if family == socket.AF_INET:
        return bytes(ctypes.cast(pointer, ctypes.POINTER(_Sockaddr4)).contents.addr)
    if family == socket.AF_INET6:
        return bytes(ctypes.cast(pointer, ctypes.POINTER(_Sockaddr6)).contents.addr)
    return None


def interfaces() -> dict[str, list[str]]:
    """Each interface's addresses as ``address/prefix`` (``{"lo": ["127.0.0.1/8", "::1/128"], …}``), sorted."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    found: dict[str, set[str]] = {}
    try:
        entry = head
        while entry:
            item = entry.contents
            name = (item.name or b"").decode("utf-8", "replace")
            address, mask = _raw(item.addr), _raw(item.netmask)
            if name:
                found.setdefault(name, set())
            if name and address:
                prefix = sum(bin(byte).count("1") for byte in mask or b"\xff" * len(address))
                found[name].add(f"{ipaddress.ip_address(address)}/{prefix}")
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return {name: sorted(addresses) for name, addresses in sorted(found.items())}


def carrier(found: dict[str, list[str]], ip: str) -> str | None:
    """The interface that carries ``ip``: the one holding that address, else (on Linux the loopback
    interface takes all of 127.0.0.0/8) the loopback interface whose network holds it."""
    wanted = ipaddress.ip_address(ip)
    for name, addresses in found.items():
        if any(ipaddress.ip_interface(a).ip == wanted for a in addresses):
            return name
    if wanted.is_loopback:
        for name, addresses in found.items():
            if any(wanted in ipaddress.ip_interface(a).network for a in addresses):
                return name
    return None


def shown_interfaces(found: Mapping[str, list[str]]) -> str:
    """Interfaces and their addresses, as an error message names them (``eth0 10.0.0.1/24, lo …``)."""
    return ", ".join(f"{name} {' '.join(addresses) or '(no address)'}" for name, addresses in found.items())


def main(argv: list[str]) -> int:
    """The host probe: the paths matching the patterns in ``argv[0]`` (JSON), the interfaces and the host's
    name (with host networking a container has the host's: two engines on one machine give one name)."""
    patterns = json.loads(argv[0])
    paths = sorted({p for pattern in patterns for p in glob.glob(pattern)})
    found = {"paths": paths, "interfaces": interfaces(), "hostname": socket.gethostname()}
    print(json.dumps(found, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
