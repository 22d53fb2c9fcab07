#!/usr/bin/env python3
"""Read and write minitrain token shards with numpy (format: docs/data_format.md).

Library use:
    from shards import read_shard, write_shard, pack_documents
    tokens, starts = pack_documents([[5, 6, 7], [8, 9]], eot=50256)   # [EOT, doc...] per document
    write_shard("train_000000.bin", tokens, starts, vocab_size=50257, eot_token=50256)
    header, tokens, starts = read_shard("train_000000.bin")            # verifies checksums and ids

Command line:
    shards.py info  SHARD             print the header and counts (exit 1 if the shard is damaged)
    shards.py copy  SRC DST           read SRC (verified) and write it again as DST
    shards.py from-npy TOKENS.npy DST --vocab V --eot E
                                      one document per row of a 2-D array, or one document for 1-D
"""
import argparse
import os
import struct
import sys
import zlib

import numpy as np

MAGIC = b"MTTOKENS"
VERSION = 1
HEADER_BYTES = 64
# magic, version, token_bytes, vocab_size, eot_token, num_tokens, num_docs, data_crc, 16 reserved
HEADER = struct.Struct("<8sIIIIQQI16s")


class ShardError(Exception):
    pass


def _index_offset(num_tokens, token_bytes):
    return HEADER_BYTES + (num_tokens * token_bytes + 7) // 8 * 8


def pack_documents(docs, eot):
    """Joins documents as [EOT, doc...] each; returns (tokens, doc_starts) as int64 arrays."""
    tokens, starts = [], []
    n = 0
    for d in docs:
        starts.append(n)
        tokens.append(np.array([eot], dtype=np.int64))
        tokens.append(np.asarray(d, dtype=np.int64))
        n += 1 + len(d)
    if not tokens:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(tokens), np.array(starts, dtype=np.int64)


def write_shard(path, tokens, doc_starts, vocab_size, eot_token, token_bytes=None):
    """Writes a shard atomically (temporary name, then rename)."""
    tokens = np.asarray(tokens)
    starts = np.asarray(doc_starts, dtype=np.uint64)
    if token_bytes is None:
        token_bytes = 2 if vocab_size <= 65536 else 4
    if token_bytes not in (2, 4) or vocab_size > 1 << (8 * token_bytes):
        raise ShardError(f"{path}: vocab {vocab_size} does not fit {token_bytes}-byte tokens")
    if not 0 <= eot_token < vocab_size:
        raise ShardError(f"{path}: eot {eot_token} outside the vocabulary")
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ShardError(f"{path}: token ids must lie in [0, {vocab_size})")
    if len(tokens) and (len(starts) == 0 or starts[0] != 0):
        raise ShardError(f"{path}: the document index must start at token 0")
    if len(starts) > 1 and (np.any(np.diff(starts.astype(np.int64)) <= 0) or starts[-1] >= len(tokens)):
        raise ShardError(f"{path}: document starts must increase and lie inside the stream")
    tok = tokens.astype("<u2" if token_bytes == 2 else "<u4").tobytes()
    pad = b"\0" * (_index_offset(len(tokens), token_bytes) - HEADER_BYTES - len(tok))
    body = tok + pad + starts.astype("<u8").tobytes()
    head = HEADER.pack(MAGIC, VERSION, token_bytes, vocab_size, eot_token, len(tokens), len(starts),
                       zlib.crc32(body), b"\0" * 16)
    head += struct.pack("<I", zlib.crc32(head))
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_shard(path, verify=True):
    """Returns (header dict, tokens, doc_starts); raises ShardError naming the file and problem."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_BYTES:
        raise ShardError(f"{path}: truncated shard ({len(data)} bytes, shorter than the header)")
    magic, version, tb, vocab, eot, n, ndocs, data_crc, _ = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ShardError(f"{path}: not a minitrain token shard (wrong magic)")
    if version != VERSION:
        raise ShardError(f"{path}: shard format version {version} is not supported")
    (header_crc,) = struct.unpack_from("<I", data, 60)
    if zlib.crc32(data[:60]) != header_crc:
        raise ShardError(f"{path}: header checksum mismatch")
    if tb not in (2, 4):
        raise ShardError(f"{path}: token width {tb} is invalid")
    want = _index_offset(n, tb) + 8 * ndocs
    if len(data) != want:
        raise ShardError(f"{path}: size {len(data)} bytes, the header promises {want}")
    if verify and zlib.crc32(data[HEADER_BYTES:]) != data_crc:
        raise ShardError(f"{path}: data checksum mismatch")
    tokens = np.frombuffer(data, dtype="<u2" if tb == 2 else "<u4", count=n, offset=HEADER_BYTES)
    starts = np.frombuffer(data, dtype="<u8", count=ndocs, offset=_index_offset(n, tb))
    if verify and n and int(tokens.max()) >= vocab:
        raise ShardError(f"{path}: token id {int(tokens.max())} >= vocab size {vocab}")
    if ndocs and (starts[0] != 0 or np.any(np.diff(starts.astype(np.int64)) <= 0) or starts[-1] >= n):
        raise ShardError(f"{path}: the document index is out of order or range")
    header = dict(version=version, token_bytes=tb, vocab_size=vocab, eot_token=eot, num_tokens=n,
                  num_docs=ndocs, data_crc=data_crc, header_crc=header_crc)
    return header, tokens, starts


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info")
    p.add_argument("shard")
    p = sub.add_parser("copy")
    p.add_argument("src")
    p.add_argument("dst")
    p = sub.add_parser("from-npy")
    p.add_argument("npy")
    p.add_argument("dst")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--eot", type=int, required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "info":
            h, tokens, starts = read_shard(a.shard)
            for k, v in h.items():
                print(f"{k:12s} {v}")
            if len(starts):
                lengths = np.diff(np.append(starts.astype(np.int64), len(tokens)))
                print(f"doc length   min {lengths.min()}, mean {lengths.mean():.1f}, max {lengths.max()}")
        elif a.cmd == "copy":
            h, tokens, starts = read_shard(a.src)
            write_shard(a.dst, tokens, starts, h["vocab_size"], h["eot_token"], h["token_bytes"])
        elif a.cmd == "from-npy":
            arr = np.load(a.npy)
            docs = [arr] if arr.ndim == 1 else list(arr)
            tokens, starts = pack_documents(docs, a.eot)
            write_shard(a.dst, tokens, starts, a.vocab, a.eot)
    except (ShardError, OSError) as e:
        print(f"shards.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
