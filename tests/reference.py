"""An independent, sequential model of a broker appending producer log lines.

Written from the spec without calling rmqlake's code, so
that tests can compare rmqlake's parallel ingest with a plain loop: every
message validated, ordered, given its queue, queue offset and physical
offset (8-byte blank rule at segment ends), and encoded to bytes whose
length must equal ``total_size``. Property order comes from the real JDK
(``java_oracle``), so the stored property bytes are checked too.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import ipaddress
import json
import math
import re
import struct
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

HALF, OP = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"
MAGIC_V1 = 0xDAA320A7 - (1 << 32)
MAGIC_V2 = 0xDAA320AB - (1 << 32)
TX = {"NOT_TYPE": 0, "PREPARED": 4, "COMMIT": 8, "ROLLBACK": 12}


def jhash(text: str) -> int:
    h = 0
    units = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "little")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def host_bytes(text: str) -> tuple[bytes, int, str]:
    """(address bytes, port, canonical text)."""
    if text.startswith("["):
        addr, port = text[1:].split("]:")
    else:
        addr, port = text.rsplit(":", 1)
    ip = ipaddress.ip_address(addr)
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    canonical = f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return ip.packed, int(port), canonical


@dataclass
class RefConfig:
    segment_size: int
    queue_counts: dict[str, int]
    default_queues: int = 4
    compaction_topics: frozenset = frozenset()
    max_message_size: int = 4194304
    cluster: str = "DefaultCluster"
    store_host: str = "127.0.0.1:10911"
    born_host: str = "127.0.0.1:49152"
    timezone: str = "UTC"
    delay_levels: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    timer_precision_ms: int = 1000
    timer_max_delay_sec: int = 259200

    def delay_ms(self) -> dict[int, int]:
        unit = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
        return {i: int(t[:-1]) * unit[t[-1]] for i, t in enumerate(self.delay_levels.split(), start=1)}


SCHEDULE = "SCHEDULE_TOPIC_XXXX"
TIMER = "rmq_sys_wheel_timer"
TIMER_NAMES = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
DELIVERY_SOURCE = "(scheduled delivery)"


@dataclass
class RefBroker:
    config: RefConfig
    oracle: object  # tests.java_oracle.JavaOracle
    next_offset: int = 0
    queue_heads: dict = field(default_factory=dict)
    rr: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)
    rejected: list = field(default_factory=list)
    blanks: list = field(default_factory=list)  # (position, length)
    clock: int | None = None  # the last run's delivery clock
    scheduled: list = field(default_factory=list)  # origins not delivered yet, in append order
    halves: dict = field(default_factory=dict)  # UNIQ_KEY -> the latest half message with it

    # -- validation, independent of rmqlake.ingest.lines -------------------------------------
    def _validate(self, raw: bytes, path: str, line: int, file_sha: str) -> dict | None:
        cfg = self.config
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(doc, dict):
            return None
        if "endTransaction" in doc:
            return self._end_line(doc, path, line)

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        topic, body_text, born = doc.get("topic"), doc.get("body"), doc.get("bornTimestamp")
        if not isinstance(topic, str) or not isinstance(body_text, str) or not is_int(born) or born < 0:
            return None
        if not re.fullmatch(r"[%|a-zA-Z0-9_-]+", topic) or topic in (HALF, OP):
            return None
        if len(topic) > (255 if topic.startswith("%RETRY%") else 127):
            return None
        queues = cfg.queue_counts.get(topic, cfg.default_queues)
        encoding = doc.get("bodyEncoding", "utf8")
        if encoding == "base64":
            try:
                body = base64.b64decode(body_text, validate=True)
            except ValueError:
                return None
        elif encoding == "utf8":
            body = body_text.encode()
        else:
            return None
        if len(body) > cfg.max_message_size:
            return None
        keys = doc.get("keys")
        if isinstance(keys, list):
            keys = " ".join(keys)
        keys = keys or None
        tags = doc.get("tags") or None
        if topic in cfg.compaction_topics and not (keys and keys.strip(" ")):
            return None
        store_ts = doc.get("storeTimestamp", born)
        tx = doc.get("transaction", "NOT_TYPE")
        if tx not in TX or not is_int(store_ts):
            return None
        try:
            born_addr, born_port, born_text = host_bytes(doc.get("bornHost") or cfg.born_host)
            store_addr, store_port, store_text = host_bytes(doc.get("storeHost") or cfg.store_host)
        except ValueError:
            return None
        queue_id = doc.get("queueId")
        if queue_id is not None and not (is_int(queue_id) and 0 <= queue_id < queues):
            return None
        if queue_id is None and keys:
            queue_id = abs(int(math.fmod(jhash(keys), queues)))  # SelectMessageQueueByHash
        uniq = doc.get("uniqKey")
        if not uniq:
            hash32 = int(file_sha[:8], 16)
            moment = datetime.fromtimestamp(born / 1000, ZoneInfo(cfg.timezone))
            month = int(moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)
            diff = (born - month) & 0xFFFFFFFF
            uniq = (
                (born_addr + struct.pack(">HIIH", (hash32 >> 16) & 0xFFFF, hash32, diff, line & 0xFFFF)).hex().upper()
            )
        pairs = [(k, v) for k, v in (doc.get("properties") or {}).items() if k and v]
        for field_name, name in (("delayLevel", "DELAY"), ("deliverTimeMs", "TIMER_DELIVER_MS")):
            value = doc.get(field_name)
            if value is None or (name == "DELAY" and value == 0):
                continue
            if not is_int(value) or value < 0 or dict(pairs).get(name, str(value)) != str(value):
                return None
            if name not in dict(pairs):
                pairs.append((name, str(value)))
        pairs += [
            (n, v) for n, v in (("KEYS", keys), ("TAGS", tags), ("UNIQ_KEY", uniq), ("CLUSTER", cfg.cluster)) if v
        ]
        route = None
        named = dict(pairs)
        if named.get("TRAN_MSG", "").lower() == "true" and not (doc.get("reconsumeTimes", 0) > 0 and "DELAY" in named):
            if "DELAY" in named or any(n in named for n in TIMER_NAMES):
                return None
            # TransactionalMessageBridge.parseHalfMessageInner: the half topic's queue 0, transaction bits reset
            extra = [("__transactionId__", uniq)] if uniq else []
            pairs = [*pairs, *extra, ("REAL_TOPIC", topic), ("REAL_QID", None)]
            route = {"topic": HALF, "queue": 0, "pairs": pairs, "half": True, "real_topic": topic,
                     "real_qid": queue_id}  # fmt: skip
            topic, tx = HALF, "NOT_TYPE"
        elif TX[tx] in (0, 8) and topic != SCHEDULE:
            route = self._route(topic, pairs, store_ts)
            if route == "refused":
                return None
            if route is not None:
                pairs = route["pairs"]
                route["real_topic"], route["real_qid"] = topic, queue_id
                topic = route["topic"]
        props = self.oracle.broker_properties(
            [(n, "0" if n == "REAL_QID" and v is None else v) for n, v in pairs]  # one digit until the append
        )
        if len(props) > 32767:
            return None
        sys_flag = TX[tx] | (0x10 if len(born_addr) == 16 else 0) | (0x20 if len(store_addr) == 16 else 0)
        magic = MAGIC_V2 if len(topic) > 127 else MAGIC_V1
        msg = {
            "topic": topic,
            "flag": doc.get("flag", 0),
            "sys_flag": sys_flag,
            "magic": magic,
            "born_timestamp": born,
            "born_host": born_text,
            "born_raw": born_addr + struct.pack(">i", born_port),
            "store_timestamp": store_ts,
            "store_host": store_text,
            "store_raw": store_addr + struct.pack(">i", store_port),
            "reconsume_times": doc.get("reconsumeTimes", 0),
            "prepared_transaction_offset": doc.get("preparedTransactionOffset", 0),
            "body": body,
            "body_crc": zlib.crc32(body) & 0x7FFFFFFF,
            "properties_bytes": props,
            "keys": [t for t in (keys or "").split(" ") if t],
            "keys_property": keys,
            "tags": tags,
            "uniq_key": uniq,
            "source_file": path,
            "source_line": line,
            "pairs": pairs,
            "route": route,
            "queue_id": route["queue"] if route else queue_id,
        }
        msg["bytes"] = encode(msg, queue_offset=0, physical_offset=0)
        if len(msg["bytes"]) + 8 > cfg.segment_size or len(msg["bytes"]) > cfg.max_message_size + 65536:
            return None
        return msg

    def _end_line(self, doc: dict, path: str, line: int) -> dict | None:
        kind, uniq, stamp = doc.get("endTransaction"), doc.get("uniqKey"), doc.get("storeTimestamp")
        allowed = {"endTransaction", "uniqKey", "storeTimestamp", "topic", "producerGroup", "fromTransactionCheck"}
        if kind not in ("COMMIT", "ROLLBACK") or not isinstance(uniq, str) or not uniq or set(doc) - allowed:
            return None
        if not isinstance(stamp, int) or isinstance(stamp, bool) or stamp < 0:
            return None
        return {"end": kind, "uniq_key": uniq, "store_timestamp": stamp, "end_topic": doc.get("topic"),
                "producer_group": doc.get("producerGroup"), "source_file": path, "source_line": line}  # fmt: skip

    def _end(self, end: dict) -> None:
        """EndTransactionProcessor: the latest half with the UNIQ_KEY, unless none, already ended or refused; a
        COMMIT re-puts it on its real topic and queue, then (either end) the op record names its queue offset."""
        half = self.halves.get(end["uniq_key"])
        pairs = dict(half["pairs"]) if half else {}
        if (
            half is None
            or half.get("ended")
            or (end["producer_group"] is not None and end["producer_group"] != pairs.get("PGROUP"))
            or (end["end_topic"] is not None and end["end_topic"] != pairs.get("REAL_TOPIC"))
        ):
            self.rejected.append((end["source_file"], end["source_line"]))
            return
        half["ended"] = True
        if end["end"] == "COMMIT":
            reput = dict(half)
            reput.update(
                topic=pairs["REAL_TOPIC"],
                queue_id=int(pairs["REAL_QID"]),
                sys_flag=(half["sys_flag"] & ~0xC) | 8,
                store_timestamp=end["store_timestamp"],
                prepared_transaction_offset=half["physical_offset"],
                magic=MAGIC_V2 if len(pairs["REAL_TOPIC"]) > 127 else MAGIC_V1,
                route=None,
                source_file=end["source_file"],
                source_line=end["source_line"],
            )
            reput["bytes"] = encode(reput, queue_offset=0, physical_offset=0)
            self._append(reput)
        end["half"] = half

    def _op(self, end: dict) -> None:
        """The op record of an accepted end: the half's queue offset, written by the broker (its store host)."""
        half = end["half"]
        body = f"{half['queue_offset']},".encode()
        store_v6 = len(half["store_raw"]) == 20
        op = {
            "topic": OP,
            "queue_id": 0,
            "flag": 0,
            "sys_flag": 0x30 if store_v6 else 0,
            "magic": MAGIC_V1,
            "born_timestamp": end["store_timestamp"],
            "born_host": half["store_host"],
            "born_raw": half["store_raw"],
            "store_timestamp": end["store_timestamp"],
            "store_host": half["store_host"],
            "store_raw": half["store_raw"],
            "reconsume_times": 0,
            "prepared_transaction_offset": 0,
            "body": body,
            "body_crc": zlib.crc32(body) & 0x7FFFFFFF,
            # a default HashMap (16 buckets), not the broker's decoding map: WAIT's bucket comes first (a real
            # broker's op records say so, tests/interop/test_transaction_from_rocketmq.py)
            "properties_bytes": b"WAIT\x01true\x02TAGS\x01d\x02",
            "keys": [],
            "keys_property": None,
            "tags": "d",
            "uniq_key": None,
            "source_file": end["source_file"],
            "source_line": end["source_line"],
            "pairs": [("WAIT", "true"), ("TAGS", "d")],
            "route": None,
        }
        op["bytes"] = encode(op, queue_offset=0, physical_offset=0)
        self._append(op)

    def _route(self, topic: str, pairs: list, now: int):
        """HookUtils.handleScheduleMessage, written out again: None (stored as sent), "refused" or the routing."""
        cfg = self.config
        named = dict(pairs)
        level = 0
        if "DELAY" in named:
            if not re.fullmatch(r"[+-]?[0-9]+", named["DELAY"]) or not -(2**31) <= int(named["DELAY"]) < 2**31:
                return "refused"
            level = int(named["DELAY"])
        if level > 0:
            pairs = [(n, v) for n, v in pairs if n not in TIMER_NAMES]
            levels = cfg.delay_ms()
            if level > max(levels):
                level = max(levels)
                pairs = [(n, str(level) if n == "DELAY" else v) for n, v in pairs]
            pairs = [*pairs, ("REAL_TOPIC", topic), ("REAL_QID", None)]
            return {"topic": SCHEDULE, "queue": level - 1, "pairs": pairs, "level": level,
                    "due": now + levels[level]}  # fmt: skip
        if topic == TIMER or "TIMER_OUT_MS" in named or not any(n in named for n in TIMER_NAMES):
            return None
        for name in ("TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_DELIVER_MS"):
            if name in named:
                if not re.fullmatch(r"[+-]?[0-9]+", named[name]):
                    return "refused"
                value = int(named[name])
                deliver = {"TIMER_DELAY_SEC": now + value * 1000, "TIMER_DELAY_MS": now + value}.get(name, value)
                break
        if deliver <= now:
            return None
        if deliver - now > cfg.timer_max_delay_sec * 1000:
            return "refused"
        precision = cfg.timer_precision_ms
        out = deliver - precision if deliver % precision == 0 else deliver // precision * precision
        pairs = [*pairs, ("TIMER_OUT_MS", str(out)), ("REAL_TOPIC", topic), ("REAL_QID", None)]
        return {"topic": TIMER, "queue": 0, "pairs": pairs, "level": 0, "due": out + precision}

    def _delivery(self, origin: dict, *, earlier: bool) -> dict:
        """ScheduleMessageService.messageTimeUp / TimerMessageStore.convert of an origin whose REAL_QID is set."""
        route = origin["route"]
        pairs = origin["pairs"]
        if origin["topic"] == TIMER:
            precision = self.config.timer_precision_ms
            enqueue = origin["store_timestamp"] // precision * precision
            props = self.oracle.broker_properties(
                [*origin["stored_pairs"], ("TIMER_ENQUEUE_MS", str(enqueue)), ("TIMER_DEQUEUE_MS", str(route["due"]))]
            )
        else:
            props = origin["properties_bytes"]
        msg = dict(origin)
        msg.update(
            topic=route["real_topic"],
            queue_id=int(dict(pairs)["REAL_QID"]),
            store_timestamp=route["due"],
            properties_bytes=props,
            magic=MAGIC_V2 if len(route["real_topic"]) > 127 else MAGIC_V1,
            route=None,
            source_file=DELIVERY_SOURCE if earlier else origin["source_file"],
            source_line=origin["physical_offset"] if earlier else origin["source_line"],
        )
        msg["bytes"] = encode(msg, queue_offset=0, physical_offset=0)
        return msg

    # -- the append loop -----------------------------------------------------------------------
    def ingest_files(self, paths: list[str], *, now: int | None = None) -> None:
        """Read, validate, order and append one batch of files, as one ingest run: the messages in append order
        and, among them, the deliveries due by the run's clock (the latest of the last one's, the last message's
        store time and ``now``)."""
        batch = []
        for path in sorted(paths):
            with open(path, "rb") as handle:
                data = handle.read()
            sha = hashlib.sha256(data).hexdigest()
            text = gzip.decompress(data) if path.endswith(".gz") else data
            lines = text.split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            for number, raw in enumerate(lines, start=1):
                raw = raw[:-1] if raw.endswith(b"\r") else raw
                msg = self._validate(raw, path, number, sha)
                if msg is None:
                    self.rejected.append((path, number))
                else:
                    batch.append(msg)
        batch.sort(key=lambda m: (m["store_timestamp"], m["source_file"], m["source_line"]))
        clocks = [t for t in (self.clock, batch[-1]["store_timestamp"] if batch else None, now) if t is not None]
        clock = max(clocks) if clocks else None
        earlier = [(o["route"]["due"], 1, -(1 << 63), "", o["physical_offset"], o, True) for o in self.scheduled]
        events = [(m["store_timestamp"], 0, m["store_timestamp"], m["source_file"], m["source_line"], m, False)
                  for m in batch]  # fmt: skip
        events += [e for e in earlier if clock is not None and e[0] <= clock]
        events += [(m["route"]["due"], 1, m["store_timestamp"], m["source_file"], m["source_line"], m, None)
                   for m in batch if m.get("route") and "due" in m["route"] and clock is not None
                   and m["route"]["due"] <= clock]  # fmt: skip
        # an end's op record goes after everything else stored in its millisecond
        events += [(m["store_timestamp"], 2, m["store_timestamp"], m["source_file"], m["source_line"], m, "op")
                   for m in batch if "end" in m]  # fmt: skip
        events.sort(key=lambda e: e[:5])
        delivered = set()
        for *_, msg, earlier_origin in events:
            if "end" in msg and earlier_origin == "op":
                if msg.get("half") is not None:
                    self._op(msg)
            elif "end" in msg:
                self._end(msg)
            elif earlier_origin is False:
                self._append(msg)
                if msg["route"] and msg["route"].get("half"):
                    self.halves[msg["uniq_key"]] = msg
                elif msg["route"]:
                    self.scheduled.append(msg)
            else:
                self._append(self._delivery(msg, earlier=earlier_origin))
                delivered.add(id(msg))
        self.scheduled = [m for m in self.scheduled if id(m) not in delivered]
        self.clock = clock

    def _append(self, msg: dict) -> None:
        cfg = self.config
        route = msg.get("route")
        if route and route["real_qid"] is None:  # sent without a queue: the real topic's turn is its REAL_QID
            n = self.rr.get(route["real_topic"], 0)
            self.rr[route["real_topic"]] = n + 1
            route["real_qid"] = n % cfg.queue_counts.get(route["real_topic"], cfg.default_queues)
        if route:
            msg["pairs"] = [(k, str(route["real_qid"]) if k == "REAL_QID" else v) for k, v in msg["pairs"]]
            msg["stored_pairs"] = _pairs_of(self.oracle.broker_properties(msg["pairs"]))
            msg["properties_bytes"] = self.oracle.broker_properties(msg["pairs"])
            msg["bytes"] = encode(msg, queue_offset=0, physical_offset=0)
        if msg["queue_id"] is None:
            n = self.rr.get(msg["topic"], 0)
            self.rr[msg["topic"]] = n + 1
            msg["queue_id"] = n % cfg.queue_counts.get(msg["topic"], cfg.default_queues)
        key = (msg["topic"], msg["queue_id"])
        if msg["sys_flag"] & 0xC in (0, 8):
            msg["queue_offset"] = self.queue_heads.get(key, 0)
            self.queue_heads[key] = msg["queue_offset"] + 1
        else:
            msg["queue_offset"] = 0
        size = len(msg["bytes"])
        remaining = cfg.segment_size - self.next_offset % cfg.segment_size
        if size + 8 > remaining:
            self.blanks.append((self.next_offset, remaining))
            self.next_offset += remaining
        msg["physical_offset"] = self.next_offset
        msg["segment"] = f"{self.next_offset - self.next_offset % cfg.segment_size:020d}"
        msg["total_size"] = size
        msg["bytes"] = encode(msg, queue_offset=msg["queue_offset"], physical_offset=self.next_offset)
        msg["msg_id"] = (msg["store_raw"] + struct.pack(">q", self.next_offset)).hex().upper()
        self.next_offset += size
        self.messages.append(msg)

    def commitlog_rows(self) -> list[dict]:
        columns = [
            "segment",
            "physical_offset",
            "total_size",
            "magic",
            "body_crc",
            "queue_id",
            "flag",
            "queue_offset",
            "sys_flag",
            "born_timestamp",
            "born_host",
            "store_timestamp",
            "store_host",
            "reconsume_times",
            "prepared_transaction_offset",
            "body",
            "topic",
            "keys",
            "tags",
            "uniq_key",
            "msg_id",
            "source_file",
            "source_line",
            "properties_bytes",
        ]
        return [{c: m[c] for c in columns} for m in self.messages]

    def segment_rows(self) -> list[dict]:
        size = self.config.segment_size
        by_segment: dict[str, list] = {}
        for m in self.messages:
            by_segment.setdefault(m["segment"], []).append(m)
        active = f"{self.next_offset - self.next_offset % size:020d}"
        rows = []
        for name, msgs in sorted(by_segment.items()):
            start = int(name)
            data_end = msgs[-1]["physical_offset"] + msgs[-1]["total_size"]
            end = self.next_offset if name == active else start + size
            rows.append(
                {
                    "segment": name,
                    "start_offset": start,
                    "end_offset": end,
                    "size_bytes": end - start,
                    "message_count": len(msgs),
                    "padding_bytes": end - data_end,
                    "first_store_timestamp": msgs[0]["store_timestamp"],
                    "last_store_timestamp": msgs[-1]["store_timestamp"],
                    "status": "active" if name == active else "sealed",
                }
            )
        return rows


def _pairs_of(props: bytes) -> list[tuple[str, str]]:
    text = props.decode()
    return [tuple(entry.split("\x01", 1)) for entry in text.split("\x02") if entry]


def encode(m: dict, *, queue_offset: int, physical_offset: int) -> bytes:
    """The record bytes, field by field."""
    topic = m["topic"].encode()
    head = struct.pack(
        ">iiiiqqiq",
        m["magic"],
        m["body_crc"],
        m["queue_id"] or 0,
        m["flag"],
        queue_offset,
        physical_offset,
        m["sys_flag"],
        m["born_timestamp"],
    )
    rest = (
        m["born_raw"]
        + struct.pack(">q", m["store_timestamp"])
        + m["store_raw"]
        + struct.pack(">iqi", m["reconsume_times"], m["prepared_transaction_offset"], len(m["body"]))
        + m["body"]
        + (struct.pack(">b", len(topic)) if m["magic"] == MAGIC_V1 else struct.pack(">h", len(topic)))
        + topic
        + struct.pack(">h", len(m["properties_bytes"]))
        + m["properties_bytes"]
    )
    total = 4 + len(head) + len(rest)
    return struct.pack(">i", total) + head + rest


# -- ConsumeQueue and IndexFile, one dispatch at a time (IndexService / IndexFile / ConsumeQueue) -------------


def key_hash(key: str) -> int:
    h = jhash(key)
    return 0 if h == -(1 << 31) else abs(h)


@dataclass
class RefIndexFile:
    """IndexFile.putKey, field for field."""

    slots: int
    entries: int
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1
    slot_table: dict = field(default_factory=dict)
    entry_table: dict = field(default_factory=dict)  # number -> (hash, phy, time_diff, prev)

    def full(self) -> bool:
        return self.index_count >= self.entries

    def put_key(self, key: str, phy: int, ts: int) -> bool:
        if self.full():
            return False
        h = key_hash(key)
        slot = h % self.slots
        slot_value = self.slot_table.get(slot, 0)
        if slot_value <= 0 or slot_value > self.index_count:
            slot_value = 0
        diff = int((ts - self.begin_timestamp) / 1000) if self.begin_timestamp > 0 else 0
        diff = max(0, min(diff, (1 << 31) - 1))
        self.entry_table[self.index_count] = (h, phy, diff, slot_value)
        self.slot_table[slot] = self.index_count
        if self.index_count <= 1:
            self.begin_phy_offset, self.begin_timestamp = phy, ts
        if slot_value == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset, self.end_timestamp = phy, ts
        return True

    def select(self, results: list, key: str, max_num: int, begin: int, end: int) -> None:
        h = key_hash(key)
        value = self.slot_table.get(h % self.slots, 0)
        if value <= 0 or value > self.index_count or self.index_count <= 1:
            return
        number = value
        while len(results) < max_num:
            kh, phy, diff, prev = self.entry_table[number]
            read = self.begin_timestamp + diff * 1000
            if kh == h and begin <= read <= end:
                results.append(phy)
            if prev <= 0 or prev > self.index_count or prev == number or read < begin:
                break
            number = prev


def ref_file_name(ts: int, zone: str, previous: str | None) -> str:
    moment = datetime.fromtimestamp(ts / 1000, ZoneInfo(zone))
    name = moment.strftime("%Y%m%d%H%M%S") + f"{ts % 1000:03d}"
    if previous is not None and name <= previous:
        base = datetime.strptime(previous, "%Y%m%d%H%M%S%f")
        base = base.replace(microsecond=0) + timedelta(milliseconds=int(previous[14:]) + 1)
        name = base.strftime("%Y%m%d%H%M%S") + f"{base.microsecond // 1000:03d}"
    return name


@dataclass
class RefDispatcher:
    """ReputMessageService's CQ and index dispatchers over messages in physical-offset order."""

    slots: int
    entries: int
    units_per_file: int
    zone: str = "UTC"
    index_enable: bool = True
    files: list = field(default_factory=list)  # [(name, RefIndexFile)]
    units: list = field(default_factory=list)
    index_msg_timestamp: int = 0

    def dispatch(self, m: dict) -> None:
        tx = m["sys_flag"] & 0xC
        props = dict(p.split("\x01", 1) for p in m["properties_bytes"].decode().split("\x02") if "\x01" in p)
        if tx in (0, 8):
            tags = props.get("TAGS")
            code = jhash(tags) if tags else 0
            if m["topic"] == "SCHEDULE_TOPIC_XXXX" and "DELAY" in props:
                level = min(int(props["DELAY"]), 18)
                delays = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]
                if level > 0:
                    code = m["store_timestamp"] + delays[level - 1] * 1000
            file_bytes = self.units_per_file * 20
            self.units.append(
                {
                    "topic": m["topic"],
                    "queue_id": m["queue_id"],
                    "queue_offset": m["queue_offset"],
                    "commitlog_offset": m["physical_offset"],
                    "size": m["total_size"],
                    "tags_code": code,
                    "store_timestamp": m["store_timestamp"],
                    "cq_file": f"{m['queue_offset'] * 20 // file_bytes * file_bytes:020d}",
                }
            )
        if not self.index_enable or tx == 0xC:
            return
        keys = ([props["UNIQ_KEY"]] if "UNIQ_KEY" in props else []) + [k for k in props.get("KEYS", "").split(" ") if k]
        for key in keys:
            self._put(f"{m['topic']}#{key}", m["physical_offset"], m["store_timestamp"])

    def _put(self, key: str, phy: int, ts: int) -> None:
        if not self.files or self.files[-1][1].full():
            previous = self.files[-1] if self.files else None
            end_phy, end_ts = (previous[1].end_phy_offset, previous[1].end_timestamp) if previous else (0, 0)
            if previous:
                self.index_msg_timestamp = previous[1].end_timestamp
            index = RefIndexFile(
                self.slots,
                self.entries,
                begin_timestamp=end_ts,
                end_timestamp=end_ts,
                begin_phy_offset=end_phy,
                end_phy_offset=end_phy,
            )
            self.files.append((ref_file_name(ts, self.zone, previous[0] if previous else None), index))
        assert self.files[-1][1].put_key(key, phy, ts)

    def index_rows(self) -> list[dict]:
        return [
            {
                "index_file": name,
                "index_no": n,
                "key_hash": e[0],
                "slot": e[0] % self.slots,
                "phy_offset": e[1],
                "time_diff": e[2],
                "prev_index": e[3],
            }
            for name, f in self.files
            for n, e in sorted(f.entry_table.items())
        ]

    def header_rows(self) -> list[dict]:
        return [
            {
                "index_file": name,
                "begin_timestamp": f.begin_timestamp,
                "end_timestamp": f.end_timestamp,
                "begin_phy_offset": f.begin_phy_offset,
                "end_phy_offset": f.end_phy_offset,
                "hash_slot_count": f.hash_slot_count,
                "index_count": f.index_count,
            }
            for name, f in self.files
        ]

    def query(self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int = (1 << 63) - 1) -> list[int]:
        """IndexService.queryOffset: newest file first, stop once a file begins before ``begin``."""
        results: list[int] = []
        max_num = min(max_num, 64)
        for _, f in reversed(self.files):
            matched = (
                (begin < f.begin_timestamp and end > f.end_timestamp)
                or (f.begin_timestamp <= begin <= f.end_timestamp)
                or (f.begin_timestamp <= end <= f.end_timestamp)
            )
            if matched:
                f.select(results, f"{topic}#{key}", max_num, begin, end)
            if f.begin_timestamp < begin or len(results) >= max_num:
                break
        return results
