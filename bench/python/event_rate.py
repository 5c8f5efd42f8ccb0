#!/usr/bin/env python3
"""KV events end to end: the rate at which a worker's publishes reach a subscriber through a real
kvpoold, with and without token ids, against the same publishes with events off, in one run.

One worker (this process) replays `--requests` requests of `--blocks` new blocks each on a private
kvpoold (host backend, `--capacity` pages of `--tpp` tokens): alloc, publish the blocks as one chain
with their token ids (as SequenceCache does), release. Once the pool is full every alloc evicts,
so the events are a steady mix of BlockStored and BlockRemoved. A subscriber in another process
(pyzmq) reads every message as it comes and decodes them after the run. Modes:
  off          no events endpoint: the publish path alone (the baseline);
  ids-off      events on, `events.zmq_token_ids: false` (hashes and parents only);
  ids-on       events on with token ids (the default);
  unheard      as ids-on with no subscriber: what the daemon's side costs alone (libzmq drops
               messages nobody subscribed to before they reach a queue).
Prints per mode: blocks published per second by the worker (and its ratio to `off`), blocks the
subscriber received as BlockStored per second (first publish to last message), payload bytes per
stored block, and the batches the daemon dropped (0 expected: the subscriber keeps up).

    PYTHONPATH=build/release/python KVPOOLD_BIN=build/release/daemon/kvpoold \\
      /usr/bin/python3 bench/python/event_rate.py
"""

import argparse
import multiprocessing as mp
import os
import tempfile
import time

import kvpool
from kvpool.local_daemon import LocalDaemon


def config(args, endpoint, token_ids):
    events = ""
    if endpoint:
        events = f"""events:
  zmq_endpoint: "{endpoint}"
  zmq_token_ids: {"true" if token_ids else "false"}
"""
    return f"""backend: host
pools:
  - name: default
    geometry: {{layers: 2, kv_heads: 1, head_dim: 8, tokens_per_page: {args.tpp}, dtype: fp16}}
    capacity: {args.capacity} pages
    policy: lru
{events}"""


def subscriber(endpoint, ready, stop, out):
    """Receives every message until `stop` is set and nothing more arrives; sends back the
    payloads' byte total and the blocks stored and removed."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 0)  # unbounded: the subscriber never drops
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    ready.set()
    payloads = []
    last = time.monotonic()
    while True:
        if sock.poll(50):
            payloads.append(sock.recv_multipart()[2])
            last = time.monotonic()
        elif stop.is_set():
            break
    stored = removed = 0
    for p in payloads:
        _, events, *_ = msgpack.unpackb(p, raw=False, strict_map_key=False)
        for e in events:
            if e[0] == "BlockStored":
                stored += len(e[1])
            elif e[0] == "BlockRemoved":
                removed += len(e[1])
    out.send((len(payloads), sum(len(p) for p in payloads), stored, removed, last))
    sock.close(0)
    ctx.term()


def run_mode(args, mode, chains, tokens):
    with tempfile.TemporaryDirectory(prefix="kvpool-events-") as tmp:
        endpoint = "" if mode == "off" else f"ipc://{tmp}/events"
        with LocalDaemon(config(args, endpoint, mode != "ids-off")) as daemon:
            conn = kvpool.attach(daemon.socket, worker="event-rate")
            sub = None
            if endpoint and mode != "unheard":
                ready, stop = mp.Event(), mp.Event()
                receiver, sender = mp.Pipe(duplex=False)
                sub = mp.Process(target=subscriber, args=(endpoint, ready, stop, sender))
                sub.start()
                ready.wait()
                time.sleep(0.5)  # the subscription reaches the daemon's PUB socket
            t0 = time.monotonic()
            for chain in chains:
                pages = conn.alloc(len(chain))
                conn.publish(pages, chain, token_ids=tokens)
                conn.release(pages[::-1])
            t1 = time.monotonic()
            row = {"mode": mode, "published_per_s": len(chains) * args.blocks / (t1 - t0)}
            if sub is not None:
                stats = conn.daemon_stats()
                stop.set()
                messages, nbytes, stored, removed, last = receiver.recv()
                sub.join()
                row.update(received_per_s=stored / (last - t0), bytes_per_block=nbytes / stored,
                           stored=stored, removed=removed, messages=messages,
                           dropped=stats["kv_batches_dropped"])
            conn.close()
            return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--blocks", type=int, default=16, help="new blocks per request")
    parser.add_argument("--tpp", type=int, default=16, help="tokens per page")
    parser.add_argument("--capacity", type=int, default=8192, help="pool pages")
    args = parser.parse_args()

    hasher = kvpool.BlockHasher()
    geometry = kvpool.Geometry(2, 1, 8, args.tpp, "fp16")
    # Token ids of a 128k vocabulary (most msgpack as 5-byte integers); each request its own root,
    # so every block is new.
    tokens = [(i * 2654435761) % 128256 for i in range(args.blocks * args.tpp)]
    chains = [hasher.chain(hasher.root(f"request-{r}", geometry), tokens, args.tpp)
              for r in range(args.requests)]

    modes = ("off", "unheard", "ids-off", "ids-on")
    rows = [run_mode(args, mode, chains, tokens) for mode in modes]
    base = rows[0]["published_per_s"]
    print(f"{args.requests} requests x {args.blocks} blocks of {args.tpp} tokens, "
          f"pool of {args.capacity} pages (LRU), one worker, one subscriber")
    print("| events | published blocks/s | vs off | received BlockStored blocks/s "
          "| payload bytes per block | BlockRemoved blocks | messages | dropped |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "stored" not in r:
            print(f"| {r['mode']} | {r['published_per_s']:,.0f} "
                  f"| {r['published_per_s'] / base:.2f} | - | - | - | - | - |")
            continue
        print(f"| {r['mode']} | {r['published_per_s']:,.0f} | {r['published_per_s'] / base:.2f} "
              f"| {r['received_per_s']:,.0f} | {r['bytes_per_block']:.1f} | {r['removed']:,} "
              f"| {r['messages']:,} | {r['dropped']} |")
        if r["stored"] != args.requests * args.blocks:
            print(f"  ! {r['mode']}: the subscriber saw {r['stored']} stored blocks, "
                  f"{args.requests * args.blocks} were published")


if __name__ == "__main__":
    main()
