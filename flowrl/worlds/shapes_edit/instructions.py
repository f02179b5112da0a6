"""Edit instructions over the shapes world, the scenes they apply to, and the exact target scene.

Kinds (the tags): recolour ("make the red circle blue"), move ("move the red circle left": 8 px), remove ("remove
the red circle"), add ("add a yellow circle above the red square"), replace ("replace the red circle with a
triangle": same colour and box). Objects are named by colour and shape, and a source scene holds each (colour,
shape) at most once, so every reference is unique. A scene is the referenced object(s) plus one or two bystanders,
drawn from a seed; the target scene is the source with exactly the requested change.

Split: an instruction whose *resulting* object (the recoloured, moved, added or replacing one; for remove, the
removed one) is one of the image world's held-out colour-shape combinations (blue triangle, yellow circle, green
square) is held out of training; eval draws from those.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from flowrl.worlds.shapes.prompts import HELD_OUT_COMBOS
from flowrl.worlds.shapes.world import COLORS, IMAGE_SIZE, SHAPES, ShapeObject, boxes_clash, random_box

KINDS = ("recolour", "move", "remove", "add", "replace")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
RELATIONS = ("left of", "right of", "above", "below")
MOVE_PIXELS = 8
_TRIES = 400


@dataclass(frozen=True)
class EditSpec:
    kind: str
    color: str  # the referenced object
    shape: str
    new_color: str | None = None  # recolour, add
    new_shape: str | None = None  # replace, add
    direction: str | None = None  # move
    relation: str | None = None  # add: the new object's relation to the referenced one

    def text(self) -> str:
        ref = f"the {self.color} {self.shape}"
        if self.kind == "recolour":
            return f"make {ref} {self.new_color}"
        if self.kind == "move":
            return f"move {ref} {self.direction}"
        if self.kind == "remove":
            return f"remove {ref}"
        if self.kind == "add":
            return f"add a {self.new_color} {self.new_shape} {self.relation} {ref}"
        return f"replace {ref} with a {self.new_shape}"

    def result_object(self) -> tuple[str, str]:
        """(colour, shape) of the object the edit produces (for remove: the one it takes away)."""
        if self.kind == "recolour":
            return self.new_color, self.shape
        if self.kind == "replace":
            return self.color, self.new_shape
        if self.kind == "add":
            return self.new_color, self.new_shape
        return self.color, self.shape


def parse_instruction(text: str) -> EditSpec:
    """The spec an instruction of the grammar names; ValueError naming it otherwise."""
    words = text.split()

    def bad():
        return ValueError(f"not an instruction of the shapes-editing grammar: {text!r}")

    def ref(at: int) -> tuple[str, str]:
        if (
            words[at : at + 1] != ["the"]
            or len(words) < at + 3
            or words[at + 1] not in COLORS
            or words[at + 2] not in SHAPES
        ):
            raise bad()
        return words[at + 1], words[at + 2]

    try:
        if words[0] == "make" and len(words) == 5 and words[4] in COLORS:
            return EditSpec("recolour", *ref(1), new_color=words[4])
        if words[0] == "move" and len(words) == 5 and words[4] in DIRECTIONS:
            return EditSpec("move", *ref(1), direction=words[4])
        if words[0] == "remove" and len(words) == 4:
            return EditSpec("remove", *ref(1))
        if words[0] == "replace" and len(words) == 7 and words[4:6] == ["with", "a"] and words[6] in SHAPES:
            return EditSpec("replace", *ref(1), new_shape=words[6])
        if words[0] == "add" and words[1] == "a" and words[2] in COLORS and words[3] in SHAPES:
            relation = " ".join(words[4:6]) if words[5:6] == ["of"] else words[4]
            rest = 6 if words[5:6] == ["of"] else 5
            if relation in RELATIONS and len(words) == rest + 3:
                return EditSpec("add", *ref(rest), new_color=words[2], new_shape=words[3], relation=relation)
    except IndexError:
        pass
    raise bad()


def all_specs() -> list[EditSpec]:
    objects = list(itertools.product(COLORS, SHAPES))
    specs = [EditSpec("recolour", c, s, new_color=n) for c, s in objects for n in COLORS if n != c]
    specs += [EditSpec("move", c, s, direction=d) for c, s in objects for d in DIRECTIONS]
    specs += [EditSpec("remove", c, s) for c, s in objects]
    specs += [EditSpec("replace", c, s, new_shape=n) for c, s in objects for n in SHAPES if n != s]
    specs += [
        EditSpec("add", c, s, new_color=nc, new_shape=ns, relation=r)
        for c, s in objects
        for nc, ns in objects
        if (nc, ns) != (c, s)
        for r in RELATIONS
    ]
    return specs


def is_held_out(spec: EditSpec) -> bool:
    return spec.result_object() in HELD_OUT_COMBOS


def train_instruction_set() -> dict[str, list[str]]:
    return {kind: [s.text() for s in all_specs() if s.kind == kind and not is_held_out(s)] for kind in KINDS}


def all_instruction_set() -> dict[str, list[str]]:
    """Every instruction of the grammar by kind, held-out ones included (what the editor's pretraining may draw)."""
    return {kind: [s.text() for s in all_specs() if s.kind == kind] for kind in KINDS}


def eval_instruction_set(per_kind: int = 8, seed: int = 5) -> list[str]:
    """Up to `per_kind` held-out instructions per kind (a fixed draw)."""
    return draw_held_out(per_kind, seed)


def val_instruction_set(per_kind: int = 8, seed: int = 6) -> list[str]:
    """Up to `per_kind` held-out instructions per kind that the eval set does not name (a fixed draw): where recipe
    choices are made, so the eval split stays unused by any choice. A kind whose held-out instructions are all in
    the eval set (remove has 3, replace 6) keeps them; its validation items differ from eval's by their scenes."""
    return draw_held_out(per_kind, seed, avoid=set(eval_instruction_set()))


def draw_held_out(per_kind: int, seed: int, avoid: set[str] = frozenset()) -> list[str]:
    """Up to `per_kind` held-out instructions per kind, drawn with `seed` among those not in `avoid` (among all of
    the kind's when `avoid` holds every one)."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in KINDS:
        held = [s.text() for s in all_specs() if s.kind == kind and is_held_out(s)]
        pool = [t for t in held if t not in avoid] or held
        out += [pool[i] for i in sorted(rng.permutation(len(pool))[:per_kind])]
    return out


def _moved(obj: ShapeObject, direction: str) -> ShapeObject:
    dx, dy = DIRECTIONS[direction]
    return replace(obj, x0=obj.x0 + dx * MOVE_PIXELS, y0=obj.y0 + dy * MOVE_PIXELS)


def _in_frame(obj: ShapeObject) -> bool:
    return 0 <= obj.x0 and 0 <= obj.y0 and obj.x0 + obj.size <= IMAGE_SIZE and obj.y0 + obj.size <= IMAGE_SIZE


def _relation_holds(new: ShapeObject, ref: ShapeObject, relation: str, margin: float = 4.0) -> bool:
    (ax, ay), (bx, by) = new.centroid, ref.centroid
    along = {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}[relation]
    across = abs(ay - by) if relation in ("left of", "right of") else abs(ax - bx)
    return along > margin and along > across


def apply_edit(spec: EditSpec, source: list[ShapeObject], added: ShapeObject | None = None) -> list[ShapeObject]:
    """The target scene: the source with exactly the requested change (`added`: the object an add places)."""
    target = []
    for obj in source:
        if (obj.color, obj.shape) != (spec.color, spec.shape):
            target.append(obj)
        elif spec.kind == "recolour":
            target.append(replace(obj, color=spec.new_color))
        elif spec.kind == "move":
            target.append(_moved(obj, spec.direction))
        elif spec.kind == "replace":
            target.append(replace(obj, shape=spec.new_shape))
        elif spec.kind == "add":
            target.append(obj)
    return target + ([added] if spec.kind == "add" else [])


def sample_scene(spec: EditSpec, rng: np.random.Generator) -> tuple[list[ShapeObject], list[ShapeObject]]:
    """(source objects, target objects) for `spec`: the referenced object plus 1-2 bystanders, each (colour, shape)
    at most once in either scene, placed so that the edit keeps every object in frame and apart."""
    for _ in range(_TRIES):
        taken = {(spec.color, spec.shape), spec.result_object()}
        ref = ShapeObject(spec.shape, spec.color, *random_box(rng))
        added = None
        if spec.kind == "add":
            added = ShapeObject(spec.new_shape, spec.new_color, *random_box(rng))
            if boxes_clash(added, ref) or not _relation_holds(added, ref, spec.relation):
                continue
        if spec.kind == "move" and not _in_frame(_moved(ref, spec.direction)):
            continue
        objects = [ref]
        keep_clear = [added] if added else []  # a bystander keeps clear of the object an add places too
        bystanders = int(rng.integers(1, 3))
        for _ in range(_TRIES):
            if len(objects) == 1 + bystanders:
                break
            color, shape = COLORS[rng.integers(len(COLORS))], SHAPES[rng.integers(len(SHAPES))]
            obj = ShapeObject(shape, color, *random_box(rng))
            if (color, shape) in taken or any(boxes_clash(obj, o) for o in objects + keep_clear):
                continue
            objects.append(obj)
            taken.add((color, shape))
        target = apply_edit(spec, objects, added)
        if len(objects) == 1 + bystanders and all(not boxes_clash(a, b) for a, b in itertools.combinations(target, 2)):
            return objects, target
    raise RuntimeError(f"could not place a scene for {spec.text()!r}")


def scene_for(instruction: str, scene_seed: int) -> tuple[EditSpec, list[ShapeObject], list[ShapeObject]]:
    """(spec, source, target) of an instruction with its scene seed: what a condition item names."""
    spec = parse_instruction(instruction)
    return (spec, *sample_scene(spec, np.random.default_rng(scene_seed)))
