"""The `kdq` commands for a micro-batch that keeps failing: `stream-failure` (the failure record and the
quarantine list, `--clear`), `quarantine-offsets` and `quarantine-batch` (:mod:`kdq.stream.failures`)."""

from __future__ import annotations

import argparse
import sys

from kdq.config import Config


def stream_failure(config: Config, args: argparse.Namespace) -> int:
    from kdq.stream import failures as batch_failures

    limit = config.stream.max_batch_failures
    if args.clear:
        failure = batch_failures.clear_failure(config)
        print(f"cleared the failure record of batch {failure['batch_id']}: the next supervisor run retries it"
              if failure else "no failure recorded")
        return 0
    failure = batch_failures.read_failure(config)
    if failure is None:
        print("no failed micro-batch recorded")
    else:
        print(batch_failures.failure_message(failure, limit))
        if batch_failures.blocked(config, limit) is None:
            print(f"(attempt {failure['attempts']} of {limit}: the supervisor still restarts it)")
    entries = batch_failures.read_quarantine(config)
    if entries:
        print("\nQuarantined offset ranges (" + batch_failures.state_dir(config).joinpath(batch_failures.QUARANTINE).as_posix() + "):")
        for e in entries:
            print(f"  #{e['id']} {e['topic']} partition {e['partition']}: offsets {e['from_offset']}..{e['to_offset']}"
                  f" - {e['reason']}")
    return 0


def print_quarantined(config: Config, added: list[dict]) -> int:
    from kdq.stream import failures as batch_failures

    for e in added:
        print(f"quarantined #{e['id']}: {e['topic']} partition {e['partition']} offsets "
              f"{e['from_offset']}..{e['to_offset']} ({e['reason']})")
    failure = batch_failures.read_failure(config)
    if failure is not None:
        hits = batch_failures.overlapping(added, failure.get("ranges") or [])
        if failure.get("ledger_written"):
            print(f"note: batch {failure['batch_id']} failed after its ledger entry was written: the quarantine "
                  "cannot change it (see `kdq stream-failure`)")
        elif not hits and failure.get("ranges"):
            print(f"note: none of these ranges is in failed batch {failure['batch_id']}'s offset ranges")
        else:
            print(f"batch {failure['batch_id']} will be retried with them by the next supervisor run "
                  "(or `kdq stream --detach`)")
    return 0


def quarantine_offsets(config: Config, args: argparse.Namespace) -> int:
    from kdq.stream import failures as batch_failures

    ranges = [{"topic": args.topic, "partition": args.partition, "from": args.from_offset, "to": args.to_offset}]
    try:
        added = batch_failures.add_quarantine(config, ranges, args.reason)
    except ValueError as exc:
        print(f"kdq quarantine-offsets: {exc}", file=sys.stderr)
        return 2
    return print_quarantined(config, added)


def quarantine_batch(config: Config, args: argparse.Namespace) -> int:
    from kdq.stream import failures as batch_failures

    failure = batch_failures.read_failure(config)
    if failure is not None and failure["batch_id"] == args.batch_id and failure.get("ranges"):
        ranges = failure["ranges"]
    else:
        ranges = batch_failures.offset_ranges(batch_failures.checkpoint_of(config), args.batch_id)
    if args.topic:
        ranges = [r for r in ranges if r["topic"] in args.topic]
    if not ranges:
        print(f"kdq quarantine-batch: no offset ranges of batch {args.batch_id}"
              + (f" for topics {', '.join(args.topic)}" if args.topic else ""), file=sys.stderr)
        return 1
    return print_quarantined(config, batch_failures.add_quarantine(config, ranges, args.reason))
