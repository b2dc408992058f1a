"""A notification's sender, as C and Python see it, is the name the
sender's connection gave in its handshake: a raw client speaking tent's
wire protocol (handshake and control frames written here by hand) that
names another engine as the sender is refused and counted, and under its
own name it is delivered as itself."""

import hashlib
import hmac
import os
import socket
import struct

import pytest

import tent

KIND_CONTROL = 1
CTL_NOTIFY, CTL_NOTIFY_DONE = 4, 5


def _transcript(label, version, kind, nonce_c, nonce_s, *names):
    out = label + struct.pack("<HB", version, kind) + nonce_c + nonce_s
    for n in names:
        out += struct.pack("<H", len(n)) + n
    return out


def _recv(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("peer closed")
        out += chunk
    return out


class RawClient:
    """A control connection to an engine, with no engine behind it."""

    def __init__(self, addr, name, secret=None):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        nonce_c = os.urandom(32)
        flags = 1 if secret else 0
        self.sock.sendall(b"TENT" + struct.pack("<HBB", 1, KIND_CONTROL, flags) + nonce_c
                          + struct.pack("<H", len(name)) + name)
        hello = _recv(self.sock, 40)
        assert hello[:4] == b"TENT" and hello[6] == 0, hello
        version, nonce_s = struct.unpack_from("<H", hello, 4)[0], hello[8:40]
        proof = bytes(32)
        if secret:
            proof = hmac.new(secret, _transcript(b"tent-client", version, KIND_CONTROL, nonce_c, nonce_s, name),
                             hashlib.sha256).digest()
        self.sock.sendall(b"\0" + proof)
        head = _recv(self.sock, 35)
        assert head[0] == 0, "the engine refused the handshake"
        _recv(self.sock, struct.unpack_from("<H", head, 33)[0])

    def notify(self, claimed, msg):
        """Sends msg naming claimed as its sender; the engine's status code."""
        payload = struct.pack("<QI", 9, len(claimed)) + claimed + struct.pack("<I", len(msg)) + msg
        self.sock.sendall(struct.pack("<B3xI", CTL_NOTIFY, len(payload)) + payload)
        typ, n = struct.unpack("<B3xI", _recv(self.sock, 8))
        body = _recv(self.sock, n)
        assert typ == CTL_NOTIFY_DONE and struct.unpack_from("<Q", body)[0] == 9
        return struct.unpack_from("<i", body, 8)[0]

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("secret", [b"s3cret", None], ids=["secret", "no-secret"])
def test_a_notification_is_delivered_under_its_connections_name(secret):
    with tent.Engine(transports="local", secret=secret, timeout=10) as target, \
            tent.Engine(transports="local", secret=secret, timeout=10) as victim:
        # The legitimate path: the victim's own notification names it.
        with victim.open_segment(target.name) as seg:
            victim.notify(seg, b"genuine")
        assert target.recv_notification(timeout=10) == (victim.name, b"genuine")

        raw = RawClient(target.name, b"rogue", secret)
        try:
            denied = tent.PermissionDenied("").code
            assert raw.notify(victim.name.encode(), b"forged") == denied
            assert raw.notify(b"", b"forged") == denied
            with pytest.raises(tent.Timeout):
                target.recv_notification(timeout=0)
            assert raw.notify(b"rogue", b"own") == 0
            assert target.recv_notification(timeout=10) == ("rogue", b"own")
        finally:
            raw.close()

        # A NUL ends a C string: "victim\0x" would read as the victim.
        nul = victim.name.encode() + b"\0x"
        raw = RawClient(target.name, nul, secret)
        try:
            assert raw.notify(nul, b"forged") == denied
        finally:
            raw.close()
        with pytest.raises(tent.Timeout):
            target.recv_notification(timeout=0)
        assert target.stats()["notify_sender_refused"] == 3
