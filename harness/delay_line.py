#!/usr/bin/env python3
# A user-space network emulator on a TUN device: what `tc qdisc ... netem delay D loss L%` does, for
# kernels built without sch_netem (CONFIG_NET_SCH_NETEM unset, as on the machine the multi-host
# tests were written on). harness/netns.ts routes every packet to and from an impaired host through
# this program's TUN device in the router namespace; the program holds each packet for the
# configured delay, drops the configured share at random (seeded, so a run repeats), or drops
# everything (a silent partition: no RST, no ICMP, links stay up), then writes it back to the same
# device, where the kernel routes it on to its destination. Settings come as JSON lines on stdin
# ({"delay_ms": 50, "loss_pct": 3, "partition": false}); each is acknowledged on stdout with the
# packet counts so far. Standard library only. Usage: delay_line.py TUN_NAME SEED
import collections
import fcntl
import json
import os
import random
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000

name, seed = sys.argv[1], int(sys.argv[2])
tun = os.open('/dev/net/tun', os.O_RDWR | os.O_NONBLOCK)
fcntl.ioctl(tun, TUNSETIFF, struct.pack('16sH', name.encode(), IFF_TUN | IFF_NO_PI))
rng = random.Random(seed)
delay, loss, partition = 0.0, 0.0, False
held = collections.deque()  # (due time, packet), in arrival order
counts = {'passed': 0, 'dropped': 0}
stdin = sys.stdin.fileno()
pending = b''


def say(obj):
    sys.stdout.write(json.dumps(obj) + '\n')
    sys.stdout.flush()


say({'ready': name})
while True:
    now = time.monotonic()
    timeout = max(0.0, held[0][0] - now) if held else None
    ready, _, _ = select.select([tun, stdin], [], [], timeout)
    if stdin in ready:
        data = os.read(stdin, 4096)
        if not data:
            break  # the test that started us is gone
        pending += data
        while b'\n' in pending:
            line, pending = pending.split(b'\n', 1)
            cmd = json.loads(line)
            delay = float(cmd.get('delay_ms', 0)) / 1000
            loss = float(cmd.get('loss_pct', 0)) / 100
            partition = bool(cmd.get('partition', False))
            say({'ok': True, **counts})
    if tun in ready:
        now = time.monotonic()
        while True:
            try:
                packet = os.read(tun, 65536)
            except BlockingIOError:
                break
            if partition or (loss > 0 and rng.random() < loss):
                counts['dropped'] += 1
            else:
                held.append((now + delay, packet))
    now = time.monotonic()
    while held and held[0][0] <= now:
        _, packet = held.popleft()
        try:
            os.write(tun, packet)
            counts['passed'] += 1
        except OSError:
            counts['dropped'] += 1
