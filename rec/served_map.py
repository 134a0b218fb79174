"""A ZCH table's id map as a replica serves it, and the rule that applies the update log's map
changes to it in any order the ranks' records arrive in (docs/update_log.md, "Id map changes").

Each slot's own changes come from the one rank that holds its row, in that rank's order. But an
id that leaves a slot of one rank in a round and takes a slot of another rank in a later round
has two records from two senders, and the admission may arrive first (the first rank's sender a
round behind, or a resume's restoring records for slots that moved between ranks). The map
therefore keeps, per slot, the (gen, step) of its last own change (`changed`; a slot absent
changed last at or before the export), and decides by those versions, never by arrival:

    - an admission of id X into slot s at version v while slot h holds X:
        h changed before v   -> X left h in between: h is vacated now (free, its row kept)
                                until h's own record arrives;
        h changed after v    -> X left s in between: s is written vacated (its row kept);
        h changed at v       -> two holders of one version: refused (id_held);
    - a change of slot s at a version older than s's own is superseded: not applied to the map
      (its rows are still written; a slot's rows come in its rank's order); one at s's own
      version is that change sent again, which must be in place (else map_mismatch);
    - an eviction of X from a vacated slot at a version not newer than the vacate is the one
      the vacate stood for: accepted, the slot stays free; an admission into a vacated slot at
      such a version without that eviction is refused (map_mismatch);
    - `held` (rec.updates/3) is checked against the slot as of the record's version: the
      vacated id while the record is not newer than the vacate, no check while the slot's own
      change is newer.

So after any interleaving of the ranks' records that keeps each rank's order, every slot holds
the id of its newest own change, except where a newer admission holds that id: the map the
final export has (tests/core/test_updates.py replays shuffled logs to it). rec-server's
EmbeddingTables (cpp/src/updates/embedding_tables.cpp) applies the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rec.contract.updates import UpdateRecord

if TYPE_CHECKING:
    import torch

Version = tuple[int, int]
"""(gen, step): what orders a run's records."""


@dataclass
class Plan:
    """How a checked record changes the map (the module docstring's rule)."""

    version: Version
    done: set[int] = field(default_factory=set)
    """The record's slots whose own change is newer or this one: not written."""
    vacate: dict[int, tuple[int, Version]] = field(default_factory=dict)
    """Slots an admission elsewhere frees: slot -> (the id that left, the admission's version)."""
    shadow: dict[int, Version] = field(default_factory=dict)
    """Admitted slots whose id a newer admission already holds: slot -> that version."""


@dataclass
class ServedMap:
    """A ZCH table's id map as a replica serves it (rec.contract.sections.ZCH_MAP_LAYOUT): every
    copy the model holds of its `keys` (int64 [slots]) and `used` (bool or uint8 [slots]),
    written in place together; the first copy is the one read. `changed` and `vacated` are the
    ordering state (module docstring); a vacated slot keeps its id in `keys`, unused."""

    probes: int
    copies: list[tuple[torch.Tensor, torch.Tensor]]
    changed: dict[int, Version] = field(default_factory=dict)
    vacated: dict[int, tuple[int, Version]] = field(default_factory=dict)

    @classmethod
    def empty(cls, slots: int, probes: int) -> ServedMap:
        import torch

        return cls(probes, [(torch.zeros(slots, dtype=torch.int64),
                             torch.zeros(slots, dtype=torch.bool))])  # fmt: skip

    @property
    def slots(self) -> int:
        return int(self.copies[0][0].shape[0])

    def held(self, slot: int) -> int | None:
        """The id `slot` holds, or None."""
        keys, used = self.copies[0]
        return int(keys[slot]) if bool(used[slot]) else None

    def _state(self, slots) -> dict[int, tuple[int, bool]]:
        """slot -> (key, used) of `slots`, gathered once (not the whole map: maybe 10M slots)."""
        import torch

        index = torch.unique(torch.as_tensor(list(slots), dtype=torch.int64))
        keys, used = self.copies[0]
        pairs = zip(keys[index].tolist(), used[index].tolist(), strict=True)
        return dict(zip(index.tolist(), pairs, strict=True))

    def check(self, table: str, rec: UpdateRecord) -> tuple[str | None, Plan | None]:
        """Why `rec`'s map changes do not fit this map (rec.update_log.Applier's rules and the
        module docstring's), or (None, how to write them). Every admitted id's window at once: a
        record may change thousands of slots."""
        import torch

        from rec.zch import windows

        for slot, _ in rec.evicted + rec.admitted:
            if slot >= self.slots:
                return f"slot range: slot {slot} is outside {table!r}'s {self.slots} slots", None
        ids = torch.tensor([raw for _, raw in rec.admitted], dtype=torch.int64)
        wins = windows(ids, self.slots, self.probes).tolist() if rec.admitted else []
        state = self._state([s for s, _ in rec.evicted + rec.admitted] + sum(wins, []))
        held = lambda slot: state[slot][0] if state[slot][1] else None  # noqa: E731
        v, plan = rec.version, Plan(rec.version)
        why = self._done(table, rec, plan, state)
        if why is None:
            why = self._check_evictions(table, rec, plan, held)
        if why is not None:
            return why, None
        freed = {slot for slot, _ in rec.evicted if slot not in plan.done}
        admitted: set[int] = set()
        for (slot, raw), window in zip(rec.admitted, wins, strict=True):
            if slot in plan.done:
                continue
            gone = self.vacated.get(slot)
            if slot not in freed and held(slot) is not None:
                return (f"map mismatch: slot {slot} of {table!r} holds id {held(slot)}, "
                        f"which the record does not evict, and admits id {raw}"), None  # fmt: skip
            if slot not in freed and gone is not None and v <= gone[1]:
                return (f"map mismatch: slot {slot} of {table!r} held id {gone[0]} until "
                        f"{gone[1]}, which the record of {v} does not evict"), None  # fmt: skip
            if slot not in window:
                return (f"slot range: slot {slot} is not in id {raw}'s window of {table!r} "
                        f"({self.probes} slots from {window[0]})"), None  # fmt: skip
            if raw in admitted:
                return f"id held: id {raw} is admitted twice to {table!r}", None
            admitted.add(raw)
            for h in window:
                if h == slot or h in freed or held(h) != raw:
                    continue
                own = self.changed.get(h)
                if own is None or own < v:  # X left h since: h's own record is on its way
                    plan.vacate[h] = (raw, v)
                elif own > v:  # X left this slot since, and took h
                    plan.shadow[slot] = own
                else:
                    return (f"id held: id {raw} is already held by slot {h} of {table!r} "
                            f"since {own}, the record's own (gen, step)"), None  # fmt: skip
        return None, plan

    def _done(self, table: str, rec: UpdateRecord, plan: Plan, state) -> str | None:
        """Puts in plan.done the record's slots whose own change is newer, or this one sent
        again (which must be in place: else why not)."""
        v = rec.version
        admitted = dict(rec.admitted)
        for slot, _ in rec.evicted + rec.admitted:
            own = self.changed.get(slot)
            if own is None or own < v or slot in plan.done:
                continue
            if own == v:
                key, used = state[slot]
                gone = self.vacated.get(slot)
                now = key if used else (gone[0] if gone is not None else None)
                if now != admitted.get(slot):
                    return (f"map mismatch: slot {slot} of {table!r} already changed at {own} "
                            f"to hold id {now}, the record of that (gen, step) says "
                            f"{admitted.get(slot)}")  # fmt: skip
            plan.done.add(slot)
        return None

    def _check_evictions(self, table: str, rec: UpdateRecord, plan: Plan, held) -> str | None:
        for slot, raw in rec.evicted:
            gone = self.vacated.get(slot)
            if slot in plan.done or held(slot) == raw:
                continue
            if gone is not None and gone[0] == raw and rec.version <= gone[1]:
                continue  # the eviction its vacate stood for
            return (f"map mismatch: slot {slot} of {table!r} holds id {held(slot)}, "
                    f"the record evicts id {raw}")  # fmt: skip
        return None

    def check_held(self, table: str, rec: UpdateRecord, plan: Plan | None = None) -> str | None:
        """Why `rec`'s `held` (format version 3: the id each row's slot holds after the record)
        disagrees with this map once the record's changes (`plan`) are in it, each slot as of
        the record's (gen, step) (module docstring), or None."""
        if rec.held is None or not rec.ids:
            return None
        v, plan = rec.version, plan or Plan(rec.version)
        after: dict[int, int | None] = {s: None for s, _ in rec.evicted if s not in plan.done}
        after.update({s: raw for s, raw in rec.admitted if s not in plan.done})
        unknown: set[int] = set()
        kept = [s for s in rec.ids if s < self.slots and s not in after]  # slots that keep theirs
        for s, (key, used) in (self._state(kept) if kept else {}).items():
            own, gone = self.changed.get(s), plan.vacate.get(s) or self.vacated.get(s)
            if own is not None and v < own:
                unknown.add(s)  # changed since the record: what it held then is not kept
            elif gone is not None and v <= gone[1]:
                after[s] = gone[0]
            else:
                after[s] = key if used else None
        held = dict(rec.held)
        for slot in rec.ids:
            want = after.get(slot)  # the default row (slot == slots) holds no id
            if slot not in unknown and held.get(slot) != want:
                return (f"map mismatch: slot {slot} of {table!r} holds id {want} after the record, "
                        f"the record says {held.get(slot)}")  # fmt: skip
        return None

    def settle(self, mark: Version) -> None:
        """Forgets the versions of slots last changed before `mark`, a watermark: every rank
        has sent all it published before it, so every record still to come is at `mark` or
        newer, and to such a record a slot changed before it is one changed at the export. (Not
        at it: a round's map changes follow the rows published at the same step.) Keeps
        `changed` to the slots changed since the slowest rank's last publish."""
        self.changed = {s: v for s, v in self.changed.items() if v >= mark}

    def write(self, rec: UpdateRecord, plan: Plan | None = None) -> None:
        """The vacated slots, the evictions, then the admissions, into every copy; with no
        `plan`, the record's changes as they are (a reference that applies a log in order)."""
        import torch

        plan = plan or Plan(rec.version)
        evicted = [s for s, _ in rec.evicted if s not in plan.done]
        admitted = [(s, raw) for s, raw in rec.admitted if s not in plan.done]
        out = torch.tensor(list(plan.vacate) + evicted, dtype=torch.int64)
        slots = torch.tensor([s for s, _ in admitted], dtype=torch.int64)
        ids = torch.tensor([raw for _, raw in admitted], dtype=torch.int64)
        live = torch.tensor([s not in plan.shadow for s, _ in admitted], dtype=torch.bool)
        for keys, used in self.copies:
            used[out] = False
            keys[slots] = ids
            used[slots] = live.to(used.dtype)
        self.vacated.update(plan.vacate)
        for s in evicted + [s for s, _ in admitted]:
            self.vacated.pop(s, None)
            self.changed[s] = plan.version
        for s, raw in admitted:
            if s in plan.shadow:
                self.vacated[s] = (raw, plan.shadow[s])


def replayed(keys: torch.Tensor, used: torch.Tensor, probes: int,
             records: list[UpdateRecord]) -> dict[int, int | None]:  # fmt: skip
    """The id each slot holds (None: free) in a replica whose map was (`keys`, `used`) and that
    then applied `records`' map changes in their order by this module's rule, for the slots they
    changed or freed: what a resume must set back (rec.train.publish.republish_undone). A slot
    vacated for an eviction that never came (its rank died first) is free there."""
    served = ServedMap(probes, [(keys.clone(), used.clone())])
    touched: set[int] = set()
    for rec in records:
        if not (rec.evicted or rec.admitted):
            continue
        _, plan = served.check(rec.table, rec)
        if plan is not None:  # one the replica refused changed nothing there
            served.write(rec, plan)
            touched |= {s for s, _ in rec.evicted + rec.admitted} | set(plan.vacate)
    return {s: served.held(s) for s in touched}
