"""Synthetic worlds built from the target's tool schemas: the world of one instance (``World``), its
entities and their facts, the same in every tool result. Which tools read or write and the seeded,
realistic values for every parameter (Faker, guided by types, formats, enums and names) are
``trainer.schema_values``."""

from __future__ import annotations

import copy
import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracefix.trainer.result_shapes import dress
from tracefix.trainer.schema_values import _ID_NAME, SeededFaker, Values, entity_of

if TYPE_CHECKING:  # the environment module builds each instance's World: only the type is needed here
    from tracefix.trainer.environment import Tool


# -- the world of one instance ---------------------------------------------------------------------

# Kinds of entity that are people: their records show a person's name and e-mail, and a record of
# another kind that names one of them (``user_id``) belongs to that person.
PERSON_KINDS = frozenset({"user", "customer", "account", "member", "person", "client", "guest", "patient", "passenger", "profile"})
# ``customer_name``, ``holder_name``…: the name of a record's holder, whatever the record's kind.
_HOLDER_WORDS = frozenset({"customer", "holder", "owner", "account", "member", "client", "guest", "patient", "contact", "full", "display"})
_FIRST_NAMES = frozenset({"first_name", "firstname", "given_name", "forename"})
_LAST_NAMES = frozenset({"last_name", "lastname", "family_name", "surname"})
# The fields a generic record shows after its status, in the order ``extra`` counts them.
_GENERIC = ("customer_name", "created", "amount", "email")
_DRAWS: dict[str, Callable[[Values], Any]] = {
    "created": lambda values: values.date(-90, -1),
    "amount": lambda values: round(values.random.uniform(20, 900), 2),
}


def stable_seed(*parts: Any) -> int:
    """A stable integer from printable parts (never ``hash()``: it is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def own_id(record: Mapping[str, Any]) -> str | None:
    """The field that holds a record's own id: its first id field with a string value (``reservation_id``)."""
    return next((key for key, value in record.items() if _ID_NAME.search(key) and isinstance(value, str) and value), None)


def person_role(name: str, person: bool) -> str | None:
    """Which part of a person a field shows (``name``, ``first``, ``last``, ``email``), or None. Any
    record shows its holder's ``customer_name`` and e-mail; a record of a person kind (`person`)
    also shows its own ``name``, first and last names."""
    lowered = name.lower()
    if lowered == "email" or lowered.endswith("_email"):
        return "email"
    words = lowered.split("_")
    if len(words) == 2 and words[1] == "name" and words[0] in _HOLDER_WORDS:
        return "name"
    if person and lowered == "name":
        return "name"
    if person and lowered in _FIRST_NAMES:
        return "first"
    if person and lowered in _LAST_NAMES:
        return "last"
    return None


def list_kind(name: str, value: Any) -> str:
    """The kind of entity a list field holds: its items' id field's (``payment_methods`` of
    ``{"payment_id": …}`` → ``payment``), else its name's (``reservations``, ``reservation_ids`` → ``reservation``)."""
    first = value[0] if isinstance(value, list) and value else None
    key = own_id(first) if isinstance(first, dict) else None
    if key is not None:
        return entity_of(key)
    noun = re.sub(r"_?ids$", "", name.lower()) or name.lower()
    if noun.endswith("ies"):
        return noun[:-3] + "y"
    return noun[:-1] if noun.endswith("s") and not noun.endswith("ss") else noun


@dataclass(slots=True)
class Person:
    """Who a record is about or belongs to: the name and e-mail every record of theirs shows."""

    first: str
    last: str
    email: str
    shown: bool = False  # a result showed it: it is never swapped for another person

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}".strip()

    def part(self, role: str) -> str:
        return {"name": self.name, "first": self.first, "last": self.last, "email": self.email}[role]

    def show(self, role: str, fields: Iterable[str] | None = None) -> Any:
        """The value of a field that shows `role` of this person: a string, or for a name whose field
        is an object (of `fields`), its first and last names (None when it has neither)."""
        if fields is not None:
            parts = {key: self.part(sub) for key in fields if (sub := person_role(key, True)) in ("first", "last")}
            if not parts or role != "name":
                return None
            self.shown = True
            return parts
        self.shown = True
        return self.part(role)

    def learn(self, role: str, value: Any) -> None:
        """Take in a name or e-mail a family decided (a full name, or an object of first and last names)."""
        if role == "email" and isinstance(value, str) and value:
            self.email = value
        elif role == "name" and isinstance(value, str) and value.strip() and value.strip() != self.name:
            first, _, last = value.strip().rpartition(" ")
            self.first, self.last = (first, last) if first else (last, "")
        elif role == "name" and isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and (sub := person_role(key, True)) in ("first", "last"):
                    setattr(self, sub, item)
        else:
            return
        self.shown = True


def _fields(like: Any) -> Iterable[str] | None:
    """The sub-fields of an object field, from its learned shape or a value it had; None for any other field."""
    if isinstance(like, dict) and isinstance(like.get("type"), str) and ("fields" in like or like["type"] != "object"):
        return (like.get("fields") or {}) if like["type"] == "object" else None  # a shape
    return like if isinstance(like, dict) else None


def _email(first: str, last: str, number: int) -> str:
    return re.sub(r"[^a-z0-9.]", "", f"{first}.{last}{number}".lower()) + "@example.com"


@dataclass(slots=True)
class Entity:
    """One thing the results of an instance talk about (a user, a reservation), known by kind and id."""

    kind: str
    identifier: str
    facts: dict[str, Any] = field(default_factory=dict)  # field → value, as results showed it or the family decided
    drawn: dict[str, Any] = field(default_factory=dict)  # field → the value drawn for its generic record
    handed: dict[str, list[Any]] = field(default_factory=dict)  # field → made-up values handed out in records
    owner: tuple[str, str] | None = None  # the entity of a person kind it belongs to
    person: Person | None = None  # a person kind's own person; another kind's holder while it has no owner
    belongings: list[tuple[str, str]] = field(default_factory=list)  # a person kind's: what belongs to it

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.identifier)

    @property
    def is_person(self) -> bool:
        return self.kind in PERSON_KINDS


class World:
    """The entities the tool results of one instance talk about, and their facts: the one place an
    entity's name, e-mail and status live, so that every result shows them alike.

    Families make an entity's generic record with ``record`` (its made-up fields drawn once per
    entity from the seed), and every result the instance produces goes through ``present``, which
    keeps the family's own fields as the task's facts (a later one, such as a write's new status,
    changes them) and shows, in each made-up field, what the world holds of that entity by then. A
    record that names an entity of a person kind (``user_id`` in a reservation, a reservation id in
    a user's record) belongs to that person and shows the holder's name and e-mail. A result of a
    tool whose result shape was learned is dressed in it with what the world knows (the user's
    name as the agent's records write names, the reservation's user, the user's reservations) and
    without the made-up fields the agent's records of that kind never have."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._entities: dict[tuple[str, str], Entity] = {}
        self._built: dict[tuple[str, str], Entity] | None = None

    def rewind(self) -> None:
        """Back to the world as its instance built it, before an episode showed anything (each reset)."""
        if self._built is None:
            self._built = copy.deepcopy(self._entities)
        else:
            self._entities = copy.deepcopy(self._built)

    def entity(self, kind: str, identifier: str) -> Entity:
        found = self._entities.get((kind, identifier))
        if found is None:
            found = self._entities[(kind, identifier)] = Entity(kind, identifier)
        return found

    def person_of(self, entity: Entity) -> Person:
        """Whose name and e-mail the entity's records show: its owner's, else its own (drawn once from the seed)."""
        holder = self._entities.get(entity.owner, entity) if entity.owner is not None else entity
        if holder.person is None:
            faker = SeededFaker(stable_seed(self.seed, "person", holder.kind, holder.identifier))
            first, last = faker.first_name(), faker.last_name()
            holder.person = Person(first, last, _email(first, last, stable_seed(self.seed, "email", holder.identifier) % 90 + 10))
        return holder.person

    # -- records the families make ---------------------------------------------------------------

    def record(
        self,
        entity: str,
        identifier: Any,
        extra: int = 3,
        key: str | None = None,
        statuses: Sequence[str] = ("active", "confirmed", "pending"),
        facts: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A plausible stored record of an entity, as a read tool would return it (id under `key`): a
        status, then up to `extra` of its holder's name, a creation date, an amount and its holder's
        e-mail, then the family's own `facts` (a ``user_id`` there makes that user the holder). What
        the world holds of the entity comes back as it is; the rest is drawn once per entity, so
        every record of it agrees (a status outside `statuses` is drawn again)."""
        key = key or f"{entity}_id"
        found = self.entity(entity_of(key), identifier if isinstance(identifier, str) else str(identifier))
        facts = {name: value for name, value in (facts or {}).items() if name != key}
        self._relate(found, None, facts, key)
        status = self._made(found, "status", lambda values: values.random.choice(list(statuses)), statuses)
        record: dict[str, Any] = {key: identifier, "status": status}
        for name in _GENERIC[:extra]:
            if name not in record:  # the key itself (an ``email`` lookup) keeps the looked-up value
                record[name] = self._made(found, name, _DRAWS.get(name))
        record.update(facts)
        return record

    def _made(self, entity: Entity, name: str, draw: Callable[[Values], Any] | None, allowed: Sequence[str] | None = None) -> Any:
        role = person_role(name, entity.is_person)
        if name in entity.facts:
            value = entity.facts[name]
        elif role is not None:
            value = self.person_of(entity).part(role)
        else:
            if name not in entity.drawn or (allowed is not None and entity.drawn[name] not in allowed):
                values = Values(stable_seed(self.seed, entity.kind, entity.identifier, name, *(allowed or ())))
                entity.drawn[name] = draw(values) if draw else None
            value = entity.drawn[name]
        handed = entity.handed.setdefault(name, [])
        if value not in handed:
            handed.append(copy.deepcopy(value))
        return copy.deepcopy(value)

    # -- results ---------------------------------------------------------------------------------

    def present(self, tool: Tool, arguments: Mapping[str, Any], result: Any, rng: random.Random) -> Any:
        """`result` of a call to `tool` (with `arguments`) as this world shows it, dressed in the
        tool's learned result shape when it has one (`rng` draws the fields nothing decided); what it
        shows is remembered. An error, or anything but an object, is shown as it is."""
        if not isinstance(result, dict) or "error" in result:
            return result
        shown = copy.deepcopy(result)
        made: list[tuple[Any, ...]] = []
        self._settle(shown, (), None, made)
        shape = tool.result_shape if isinstance(tool.result_shape, dict) and tool.result_shape.get("type") == "object" else None
        added: set[str] = set()
        if shape is not None:
            for path in made:
                _drop_unshaped(shown, shape, path)
            key = own_id(shown)
            known = self._known(self.entity(entity_of(key), shown[key]), shape, shown) if key else {}
            dressed = dress(shape, shown, rng, arguments, known)
            added = {name for name in dressed if name not in shown}
            shown = dressed
        self._remember(shown, (), None, False, added)
        return shown

    def _settle(self, value: Any, path: tuple[Any, ...], parent: Entity | None, made: list[tuple[Any, ...]]) -> None:
        """Take in the simulation's records in `value`: their own fields are facts; a made-up field
        shows what the world holds now (its path goes to `made`)."""
        if isinstance(value, list):
            for index, item in enumerate(value):
                self._settle(item, (*path, index), parent, made)
            return
        if not isinstance(value, dict):
            return
        key = own_id(value)
        found = self.entity(entity_of(key), value[key]) if key is not None else None
        if found is not None:
            self._relate(found, parent, value, key)
        for name, item in list(value.items()):
            if isinstance(item, dict | list):
                self._settle(item, (*path, name), found or parent, made)
            if found is None or name == key:
                continue
            if item in found.handed.get(name, ()):
                value[name] = self._current(found, name, item)
                made.append((*path, name))
            else:
                self._learn(found, name, item)

    def _remember(self, value: Any, path: tuple[Any, ...], parent: Entity | None, fresh: bool, added: set[str]) -> None:
        """Remember what a shown result says of each entity; fields the dressing drew (`fresh`, or
        top-level fields in `added`) first take what the world already holds."""
        if isinstance(value, list):
            for index, item in enumerate(value):
                self._remember(item, (*path, index), parent, fresh, added)
            return
        if not isinstance(value, dict):
            return
        key = own_id(value)
        found = self.entity(entity_of(key), value[key]) if key is not None else None
        drawn = [name for name in value if fresh or (not path and name in added)]
        if found is not None:
            self._relate(found, parent, value, key)
            self._list_belongings(found, value, drawn)
            self._list_holder_first(found, value, drawn)
        for name, item in list(value.items()):
            if isinstance(item, dict | list):
                self._remember(item, (*path, name), found or parent, name in drawn, added)
            if found is None or name == key:
                continue
            if name in drawn:
                role = person_role(name, found.is_person)
                shown = self.person_of(found).show(role, _fields(item)) if role is not None else None
                if shown is not None:
                    value[name] = shown
                elif name in found.facts:
                    value[name] = copy.deepcopy(found.facts[name])
            self._learn(found, name, value[name])

    def _current(self, entity: Entity, name: str, made: Any) -> Any:
        """What a made-up field of the entity shows now: its holder's name or e-mail, a fact, or the value made up."""
        role = person_role(name, entity.is_person)
        if role is not None:
            return self.person_of(entity).show(role, _fields(made))
        return copy.deepcopy(entity.facts.get(name, made))

    def _learn(self, entity: Entity, name: str, value: Any) -> None:
        role = person_role(name, entity.is_person)
        if role in ("name", "email"):
            self.person_of(entity).learn(role, value)
        entity.facts[name] = copy.deepcopy(value)

    def _relate(self, entity: Entity, parent: Entity | None, record: Mapping[str, Any], key: str) -> None:
        """Ownership the record shows: the entity nested in, or named by, a record of a person kind
        belongs to it, and the other way round."""
        related = [parent] if parent is not None else []
        for name, item in record.items():
            if name == key:
                continue
            if isinstance(item, str) and _ID_NAME.search(name):
                related.append(self.entity(entity_of(name), item))
            elif entity.is_person and isinstance(item, list) and item and all(isinstance(each, str) for each in item):
                related += [self.entity(list_kind(name, item), each) for each in item]
        for other in related:
            self._own(entity, other)
            self._own(other, entity)

    def _own(self, child: Entity, owner: Entity) -> None:
        """`child` belongs to `owner` (of a person kind) unless it belongs to someone already; a holder
        a result showed stays, and the owner takes it unless the owner's own person was shown."""
        if child.is_person or not owner.is_person or child.owner is not None or child is owner:
            return
        child.owner = owner.key
        owner.belongings.append(child.key)
        if child.person is not None and child.person.shown and (owner.person is None or not owner.person.shown):
            owner.person = child.person

    def _known(self, entity: Entity, shape: Mapping[str, Any], shown: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of the shape the result lacks whose values the world holds for its entity."""
        known: dict[str, Any] = {}
        for name, spec in (shape.get("fields") or {}).items():
            if name in shown:
                continue
            field_shape = spec.get("shape") or {}
            role = person_role(name, entity.is_person)
            if role is not None:
                value = self.person_of(entity).show(role, _fields(field_shape))
                if value is not None:
                    known[name] = value
            elif name in entity.facts:
                known[name] = copy.deepcopy(entity.facts[name])
            elif entity.owner is not None and entity_of(name) == entity.owner[0] and field_shape.get("type") == "string":
                known[name] = entity.owner[1]  # a reservation's ``user_id``: its holder's
            elif entity.is_person and field_shape.get("type") == "array" and (field_shape.get("items") or {}).get("type") == "string":
                owned = [identifier for kind, identifier in entity.belongings if kind == list_kind(name, None)]
                if owned:
                    known[name] = owned
        return known

    def _list_belongings(self, entity: Entity, record: dict[str, Any], drawn: list[str]) -> None:
        """A drawn list of a person's records of one kind (payment methods, reservations) lists what belongs to them."""
        if not entity.is_person:
            return
        for name in drawn:
            items = record[name]
            if not isinstance(items, list) or not items or not all(isinstance(item, dict) and own_id(item) for item in items):
                continue
            kind = list_kind(name, items)
            owned = [identifier for each, identifier in entity.belongings if each == kind]
            listed = {item[own_id(item)] for item in items}
            spare = iter([item for item in items if item[own_id(item)] not in owned])
            for identifier in owned:
                item = next(spare, None) if identifier not in listed else None
                if item is not None:
                    item[own_id(item)] = identifier

    def _list_holder_first(self, entity: Entity, record: dict[str, Any], drawn: list[str]) -> None:
        """A drawn list of people in a record of another kind (a reservation's passengers) starts with
        its holder, with what the world holds of the holder (a date of birth) and adds to it."""
        if entity.is_person:
            return
        for name in drawn:
            items = record[name]
            first = items[0] if isinstance(items, list) and items else None
            if not isinstance(first, dict) or own_id(first) or not {"first", "last"} <= {person_role(key, True) for key in first}:
                continue
            person = self.person_of(entity)
            owner = self._entities.get(entity.owner) if entity.owner is not None else None
            for key, item in first.items():
                role = person_role(key, True)
                if role is not None:
                    shown = person.show(role, _fields(item))
                    first[key] = item if shown is None else shown
                elif owner is not None and key in owner.facts:
                    first[key] = copy.deepcopy(owner.facts[key])
                elif owner is not None and not isinstance(item, dict | list):
                    owner.facts[key] = item


def _drop_unshaped(result: dict[str, Any], shape: Mapping[str, Any], path: tuple[Any, ...]) -> None:
    """Drop the made-up field at `path` when the shape describes the record holding it without such a field."""
    *where, name = path
    record: Any = result
    spec: Mapping[str, Any] | None = shape
    for step in where:
        record = record[step]
        if isinstance(step, int):
            spec = spec.get("items") if spec.get("type") == "array" else None
        else:
            spec = ((spec.get("fields") or {}).get(step) or {}).get("shape") if spec.get("type") == "object" else None
        if spec is None:
            return
    if isinstance(record, dict) and spec.get("type") == "object" and "fields" in spec and name not in spec["fields"]:
        record.pop(name, None)

