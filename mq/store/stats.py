"""The stats block: counters the broker's role processes keep for the supervisor's /metrics
(mq.broker.metrics), in one multiprocessing.shared_memory segment per broker.

Layout (int64 cells in native byte order, read and written through memoryview.cast('q')):

    header  [MAGIC, VERSION, regions, rows_max, ROW_CELLS, created time_ns, 0, 0]
    region  [rows used, writer pid, writer starts, 0 ...]  (REGION_CELLS)  + rows_max rows
    row     [key length][KEY_CELLS - 1 cells of key bytes][VALUE_CELLS values]

One region per writer process: io worker `wid` writes region `wid`, the gateway role the one
before the last, the flush role the last one (`region_of`).  A row is keyed by (kind, name), stored as UTF-8 "kind\\0name", and holds
VALUE_CELLS counters whose meaning the kind gives (mq.broker.metrics: a topic's put messages
and bytes, a histogram's log2 buckets and sum, ...).  The supervisor sums equal keys over
all regions on each scrape.

Invariants (what makes it lock-free):
  * a region has one writer at a time (its process; a restart is the same region), so a
    cell is never written by two processes;
  * rows are only appended: the key bytes and key length are written before `rows used`
    counts the row, and a key never changes after that, so a reader caches keys;
  * every value cell only grows; a reader that meets a row mid-publish sees each 8-byte
    aligned cell old or new, never torn (a histogram's count is the sum of its buckets, so
    buckets and count always agree; its sum may be one publish ahead or behind).

Cost.  A shared memoryview cell `+=` costs ~145 ns here (two int conversions), a list item
`+=` ~45 ns, and a send is allowed well under 1 us of bookkeeping.  So a writer keeps its
rows as Python lists (`StatsWriter.row` hands out the list; callers increment it in place)
and `publish()` copies them into the block, one slice assignment per row: io workers every
PUBLISH_INTERVAL_S from their event loop, the flush role after each flush.

Restarts.  A restarted writer attaches its region and reads its rows back, then continues
them: totals survive a role restart and are never counted twice.  What a killed writer had
not published (at most PUBLISH_INTERVAL_S of counts) is lost: the counter grew a little
less, it never goes back.  A new broker start makes a fresh segment, so every counter starts
at 0 again: a counter reset, which Prometheus's rate() and increase() handle.

Names and the resource tracker: the segment is `<control block name>-st`, so every process
of a broker finds it from the store root alone; it is created and unlinked under the control
block's tracker rules (mq.store.control: no tracker keeps the name; register/unregister pairs
under the store root's flock).  The supervisor makes one at every start (whatever metricsPort
says: mqadmin statsAll reads the counters too); a writer that finds none records nothing."""
from __future__ import annotations

import os
import time
from array import array

from .control import close_segment, open_segment, remove_segment, segment_name

MAGIC = 0x4D51535441545331          # "MQSTATS1"
VERSION = 1
HEADER_CELLS = 8
REGION_CELLS = 8
KEY_CELLS = 32                      # [length] + 248 key bytes
KEY_BYTES_MAX = (KEY_CELLS - 1) * 8
VALUE_CELLS = 32
ROW_CELLS = KEY_CELLS + VALUE_CELLS
ROWS_MAX = 1024                     # rows per region (a worker's topics, groups x topics, statuses)
ROWS_RESERVED = 8                   # kept for the OTHER rows once a region is nearly full
OTHER = "~other"                    # the name new keys of a kind share when their region is full
PUBLISH_INTERVAL_S = 0.1            # io workers publish this often; a killed one loses at most this

# histogram rows (mq.broker.metrics): cell k counts values whose bit_length() is k, the last
# bucket also everything larger; HIST_SUM holds the sum of the values
HIST_BUCKETS = 30
HIST_SUM = 30
assert HIST_SUM < VALUE_CELLS

R_USED, R_PID, R_STARTS = 0, 1, 2


def stats_segment_name(store_root: str) -> str:
    return segment_name(store_root) + "-st"


def remove_stats_segment(store_root: str) -> bool:
    """Unlinks the stats block of `store_root` if one exists (a crashed broker's; the next start
    replaces it anyway); True if there was one."""
    return remove_segment(store_root, stats_segment_name(store_root))


def block_cells(regions: int, rows_max: int = ROWS_MAX) -> int:
    return HEADER_CELLS + regions * (REGION_CELLS + rows_max * ROW_CELLS)


def region_of(role: str, wid: int = 0, regions: int | None = None) -> int:
    """The region a writer owns: io worker `wid` -> wid; "flush" -> the last region; "grpc"
    (the gateway role, mq.gateway) -> the one before it."""
    if role == "io":
        return wid
    assert role in ("flush", "grpc") and regions is not None, role
    return regions - 1 if role == "flush" else regions - 2


def hist_add(row: list, value: int, bucket_value: int) -> None:
    """One observation into a histogram row: bucket by bucket_value.bit_length(), sum += value."""
    k = bucket_value.bit_length()
    row[k if k < HIST_BUCKETS else HIST_BUCKETS - 1] += 1
    row[HIST_SUM] += value


class StatsBlock:
    """A handle on one broker's stats block.  create=True (the supervisor): a fresh segment
    with `regions` regions, replacing a stale one; otherwise attach (FileNotFoundError when
    there is none)."""

    def __init__(self, store_root: str, regions: int = 0, create: bool = False, rows_max: int = ROWS_MAX):
        self.root = store_root
        self.name = stats_segment_name(store_root)
        self.owner = create
        assert not create or (regions > 0 and rows_max > ROWS_RESERVED), (regions, rows_max)
        shm = open_segment(store_root, self.name, create, block_cells(regions, rows_max) * 8 if create else 0)
        self._shm = shm
        self.cells = shm.buf.cast("q")
        m = self.cells
        if create:
            m[0:HEADER_CELLS] = array("q", [MAGIC, VERSION, regions, rows_max, ROW_CELLS, time.time_ns(), 0, 0])
        elif len(m) < HEADER_CELLS or m[0] != MAGIC or m[1] != VERSION or m[4] != ROW_CELLS \
                or len(m) < block_cells(m[2], m[3]):
            self.close()
            raise ValueError(f"stats block {self.name} is not this build's layout")
        self.regions = m[2]
        self.rows_max = m[3]
        self._keys: dict[int, tuple[str, str]] = {}     # row offset -> key (keys never change)

    @classmethod
    def attach_if_present(cls, store_root: str) -> "StatsBlock | None":
        try:
            return cls(store_root)
        except FileNotFoundError:
            return None

    def region_base(self, region: int) -> int:
        assert 0 <= region < self.regions, (region, self.regions)
        return HEADER_CELLS + region * (REGION_CELLS + self.rows_max * ROW_CELLS)

    def row_offset(self, region: int, row: int) -> int:
        assert 0 <= row < self.rows_max, row
        return self.region_base(region) + REGION_CELLS + row * ROW_CELLS

    def writer(self, region: int) -> "StatsWriter":
        return StatsWriter(self, region)

    # ---- the supervisor's side ---------------------------------------------------------------------
    def read(self) -> dict[tuple[str, str], list[int]]:
        """Every key's values summed over all regions."""
        m = self.cells
        out: dict[tuple[str, str], list[int]] = {}
        keys = self._keys
        for region in range(self.regions):
            base = self.region_base(region)
            used = min(m[base + R_USED], self.rows_max)
            off = base + REGION_CELLS
            for _ in range(used):
                key = keys.get(off)
                if key is None:
                    key = self._key_at(off)
                    if key is None:
                        off += ROW_CELLS
                        continue
                    keys[off] = key
                vals = m[off + KEY_CELLS:off + ROW_CELLS].tolist()
                have = out.get(key)
                if have is None:
                    out[key] = vals
                else:
                    out[key] = [a + b for a, b in zip(have, vals)]
                off += ROW_CELLS
        return out

    def region_info(self, region: int) -> tuple[int, int, int]:
        """(rows used, writer pid, writer starts) of a region."""
        base = self.region_base(region)
        return self.cells[base + R_USED], self.cells[base + R_PID], self.cells[base + R_STARTS]

    def _key_at(self, off: int) -> tuple[str, str] | None:
        n = self.cells[off]
        if not 0 < n <= KEY_BYTES_MAX:
            return None
        raw = self.cells[off + 1:off + KEY_CELLS].tobytes()[:n].decode("utf-8", "replace")
        kind, _, name = raw.partition("\0")
        return kind, name

    def close(self) -> None:
        """Unmaps; the owner also unlinks the segment."""
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        self.cells.release()
        close_segment(self.root, shm, unlink=self.owner)


class StatsWriter:
    """One process's region: rows as local lists, published into the block by publish().
    Single-threaded (the owner's event loop, or the flush loop)."""

    def __init__(self, block: StatsBlock, region: int):
        self.block = block
        self.region = region
        self.base = block.region_base(region)
        m = block.cells
        self._rows: dict[tuple[str, str], list[int]] = {}
        self._published: list[tuple[int, list[int]]] = []       # (values offset, list)
        used = min(m[self.base + R_USED], block.rows_max)
        off = self.base + REGION_CELLS
        for _ in range(used):                  # a restarted writer continues its rows
            key = block._key_at(off)
            vals = m[off + KEY_CELLS:off + ROW_CELLS].tolist()
            if key is not None:
                self._rows[key] = vals
                self._published.append((off + KEY_CELLS, vals))
            off += ROW_CELLS
        self._used = used
        m[self.base + R_PID] = os.getpid()
        m[self.base + R_STARTS] += 1
        self._scratch: list[int] = [0] * VALUE_CELLS       # a full region's last resort: counted nowhere

    def row(self, kind: str, name: str) -> list[int]:
        """The values list of (kind, name), made (and its key written) on first use.  Callers
        cache it and increment its items in place; publish() makes them visible."""
        key = (kind, name)
        vals = self._rows.get(key)
        if vals is not None:
            return vals
        raw = f"{kind}\0{name}".encode()
        if len(raw) > KEY_BYTES_MAX or self._used >= self.block.rows_max - ROWS_RESERVED:
            if name == OTHER:
                if self._used >= self.block.rows_max:
                    return self._scratch
            else:
                vals = self.row(kind, OTHER)
                if len(self._rows) < 4 * self.block.rows_max:
                    self._rows[key] = vals           # later lookups of this name land there at once
                return vals
        vals = [0] * VALUE_CELLS
        m = self.block.cells
        off = self.block.row_offset(self.region, self._used)
        padded = raw + b"\0" * (KEY_BYTES_MAX - len(raw))
        m[off + 1:off + KEY_CELLS] = memoryview(padded).cast("q")
        m[off + KEY_CELLS:off + ROW_CELLS] = array("q", vals)
        m[off] = len(raw)                            # the key is complete before the row counts
        self._used += 1
        m[self.base + R_USED] = self._used
        self._rows[key] = vals
        self._published.append((off + KEY_CELLS, vals))
        return vals

    def publish(self) -> None:
        """Copies every row's values into the block (one slice assignment per row)."""
        m = self.block.cells
        for off, vals in self._published:
            try:
                m[off:off + VALUE_CELLS] = array("q", vals)
            except OverflowError:                    # a cell past 2**63: keep the last good value
                pass


__all__ = ["StatsBlock", "StatsWriter", "region_of", "remove_stats_segment", "hist_add", "stats_segment_name",
           "HIST_BUCKETS", "HIST_SUM", "VALUE_CELLS", "OTHER", "PUBLISH_INTERVAL_S", "ROWS_MAX"]
