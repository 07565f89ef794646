"""The Python comparison worker of scripts/bench.sh.

What a competent user writes with Microsoft's official async SDKs
(azure-storage-queue, azure-data-tables, aiohttp transport) for the same job
aqw does: batch receive with a 30 s visibility, bounded concurrency (poll only
while in-flight <= threshold, so at most batch + threshold jobs run), and per
message:

    create_entity(key record, pending)   ResourceExistsError -> duplicate: delete
    [--handler-url: POST the payload to the handler, non-2xx is a failure]
    update_entity(MERGE, If-Match) to done
    delete_message

Messages are base64 JSON {"id": "..."}; the key is "bench:{id}" (RowKey =
SHA-256 hex, PartitionKey = "Bench-" + first hash byte, like aqw).

    python bench/python_worker.py --queue Q --table T [--batch 16]
        [--threshold 16] [--expect N] [--idle-exit 1.0] [--handler-url URL]

With --handler-url, each claimed job's decoded payload is POSTed to URL
(content-type application/json, `Idempotency-Key: <ProviderKey>`, as aqw's
HTTP handler sends it) through one shared aiohttp session; without it no
handler is called.

Stops when --expect messages are settled (or at --timeout), or, without
--expect, when the queue stayed empty for --idle-exit seconds. A failed
receive or message is retried (the message after its visibility timeout), not
fatal. Prints one JSON line (messages, seconds, cpu_s).
Connection: env AzureWebJobsStorage if it is a full connection string, else
Azurite's well-known development account.
"""

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient
from azure.storage.queue import TextBase64DecodePolicy
from azure.storage.queue.aio import QueueClient

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
    "TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
)


def connection_string() -> str:
    value = os.environ.get("AzureWebJobsStorage", "")
    if not value or "usedevelopmentstorage=true" in value.lower():
        return AZURITE
    return value


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Worker:
    def __init__(self, queue, table, batch, threshold, handler=None):
        self.queue = queue
        self.table = table
        # (aiohttp session, url) of the HTTP handler, or None.
        self.handler = handler
        self.batch = batch
        self.threshold = threshold
        self.in_flight = 0
        self.changed = asyncio.Condition()
        self.completed = 0
        self.duplicates = 0
        self.failed = 0
        self.last_settle = 0.0

    async def handle(self, msg, t0):
        try:
            payload = json.loads(msg.content)
            key = f"bench:{payload['id']}"
            row_key = hashlib.sha256(key.encode()).hexdigest()
            now = datetime.now(timezone.utc)
            entity = {
                "PartitionKey": f"Bench-{row_key[:2]}",
                "RowKey": row_key,
                "Key": key,
                "Function": "Bench",
                "Status": "pending",
                "ProviderKey": str(uuid.uuid4()),
                "Attempts": 1,
                "LeaseOwner": f"python/{msg.id}/{msg.dequeue_count}",
                "LeaseUntil": (now + timedelta(seconds=30)).isoformat(),
                "MessageId": msg.id,
                "FirstSeen": now.isoformat(),
            }
            try:
                meta = await self.table.create_entity(entity=entity)
            except ResourceExistsError:
                duplicate = True
            else:
                duplicate = False
                if self.handler is not None:
                    await self.call_handler(msg.content, entity["ProviderKey"])
                await self.table.update_entity(
                    entity={
                        "PartitionKey": entity["PartitionKey"],
                        "RowKey": row_key,
                        "Status": "done",
                        "CompletedAt": now.isoformat(),
                        "LeaseUntil": "",
                    },
                    mode=UpdateMode.MERGE,
                    etag=meta["etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
            try:
                await self.queue.delete_message(msg.id, msg.pop_receipt)
            except ResourceNotFoundError:
                pass
            if duplicate:
                self.duplicates += 1
            else:
                self.completed += 1
            self.last_settle = time.monotonic() - t0
        except Exception as e:  # the message returns after its visibility timeout
            self.failed += 1
            print(f"python_worker: message {msg.id} failed: {e!r}", file=sys.stderr)
        finally:
            async with self.changed:
                self.in_flight -= 1
                self.changed.notify_all()

    async def call_handler(self, payload, provider_key):
        session, url = self.handler
        async with session.post(
            url,
            data=payload.encode(),
            headers={"content-type": "application/json", "Idempotency-Key": provider_key},
        ) as resp:
            await resp.read()
            if not 200 <= resp.status < 300:
                raise RuntimeError(f"handler answered {resp.status}")

    def settled(self):
        return self.completed + self.duplicates

    async def run(self, expect, idle_exit, timeout):
        t0 = time.monotonic()
        cpu0 = cpu_seconds()
        try:
            await self.table.create_table()
        except ResourceExistsError:
            pass
        tasks = set()
        empty_polls = 0
        last_activity = time.monotonic()
        while True:
            if expect is not None and self.settled() >= expect:
                break
            if time.monotonic() - t0 > timeout:
                break
            async with self.changed:
                await self.changed.wait_for(lambda: self.in_flight <= self.threshold)
            if expect is not None and self.settled() >= expect:
                break
            pages = self.queue.receive_messages(
                messages_per_page=self.batch, visibility_timeout=30
            ).by_page()
            try:
                msgs = [m async for m in await pages.__anext__()]
            except StopAsyncIteration:
                msgs = []
            except Exception as e:  # storage hiccup: back off and poll again
                print(f"python_worker: receive failed: {e!r}", file=sys.stderr)
                msgs = []
            if not msgs:
                empty_polls += 1
                # With --expect, an empty poll only means the feeder is behind
                # or a failed message is still invisible: keep polling.
                idle = self.in_flight == 0 and time.monotonic() - last_activity >= idle_exit
                if expect is None and idle:
                    break
                if self.in_flight > 0:
                    last_activity = time.monotonic()
                delay = 0.1 + (0.8 + 0.4 * random.random()) * 0.1 * 2 ** min(empty_polls - 1, 10)
                await asyncio.sleep(min(delay, 1.0))
                continue
            empty_polls = 0
            last_activity = time.monotonic()
            for msg in msgs:
                self.in_flight += 1
                task = asyncio.create_task(self.handle(msg, t0))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return {
            "worker": "python",
            "messages": self.settled(),
            "completed": self.completed,
            "duplicates": self.duplicates,
            "failed": self.failed,
            "seconds": self.last_settle,
            "cpu_s": cpu_seconds() - cpu0,
        }


async def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threshold", type=int, default=16)
    p.add_argument("--expect", type=int)
    p.add_argument("--idle-exit", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--handler-url")
    a = p.parse_args()
    conn = connection_string()
    queue = QueueClient.from_connection_string(
        conn, a.queue, message_decode_policy=TextBase64DecodePolicy()
    )
    table = TableClient.from_connection_string(conn, table_name=a.table)
    session = None
    if a.handler_url:
        import aiohttp  # only then: without the flag the worker is as it always was

        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        async with queue, table:
            handler = (session, a.handler_url) if session is not None else None
            result = await Worker(queue, table, a.batch, a.threshold, handler).run(
                a.expect, a.idle_exit, a.timeout
            )
    finally:
        if session is not None:
            await session.close()
    print(json.dumps(result), flush=True)
    if a.expect is not None and result["messages"] < a.expect:
        print(
            f"python_worker: settled {result['messages']} of {a.expect} expected",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
