"""A small NBD client (fixed newstyle, NBD_OPT_GO, simple replies), Python standard library
only: the benchmarks' scripts use it to hold a VDI open and to write, read and flush a little
data without starting a process per request (bench/suite/suite.py, bench/soak.py)."""
import socket
import struct

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
NBD_OPT_GO = 7
NBD_REP_ACK = 1
NBD_REP_INFO = 3
NBD_CMD_READ, NBD_CMD_WRITE, NBD_CMD_DISC, NBD_CMD_FLUSH = 0, 1, 2, 3
NBD_SIMPLE_REPLY_MAGIC = 0x67446698


def _recvall(s, n):
    b = bytearray(n)
    view, got = memoryview(b), 0
    while got < n:
        k = s.recv_into(view[got:], n - got)
        if not k:
            raise EOFError("connection closed")
        got += k
    return bytes(b)


class NBD:
    def __init__(self, path, export):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(60)
        self.s.connect(path)
        magic, opt, flags = struct.unpack(">QQH", _recvall(self.s, 18))
        if magic != NBDMAGIC or opt != IHAVEOPT:
            raise RuntimeError("not a fixed-newstyle NBD server")
        self.s.sendall(struct.pack(">I", 1 | (2 if flags & 2 else 0)))  # FIXED_NEWSTYLE, NO_ZEROES
        name = export.encode()
        data = struct.pack(">I", len(name)) + name + struct.pack(">H", 0)
        self.s.sendall(struct.pack(">QII", IHAVEOPT, NBD_OPT_GO, len(data)) + data)
        self.size = None
        while True:
            _, _, rtype, rlen = struct.unpack(">QIII", _recvall(self.s, 20))
            payload = _recvall(self.s, rlen)
            if rtype == NBD_REP_ACK:
                break
            if rtype == NBD_REP_INFO and len(payload) >= 12 and struct.unpack(">H", payload[:2])[0] == 0:
                self.size = struct.unpack(">Q", payload[2:10])[0]
            elif rtype & 0x80000000:
                raise RuntimeError("NBD_OPT_GO refused (%#x): %s" % (rtype, payload[4:].decode(errors="replace")))
        self.handle = 0

    def _cmd(self, cmd, off, length, data=b""):
        self.handle += 1
        self.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, cmd, self.handle, off, length) + data)
        magic, err, handle = struct.unpack(">IIQ", _recvall(self.s, 16))
        if magic != NBD_SIMPLE_REPLY_MAGIC or handle != self.handle:
            raise RuntimeError("bad NBD reply")
        if err:
            raise OSError(err, "NBD command %d failed" % cmd)
        return _recvall(self.s, length) if cmd == NBD_CMD_READ and length else b""

    def read(self, off, length):
        return self._cmd(NBD_CMD_READ, off, length)

    def write(self, off, data):
        self._cmd(NBD_CMD_WRITE, off, len(data), data)

    def flush(self):
        self._cmd(NBD_CMD_FLUSH, 0, 0)

    def close(self):
        try:
            self.handle += 1
            self.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, NBD_CMD_DISC, self.handle, 0, 0))
        except OSError:
            pass
        self.s.close()
