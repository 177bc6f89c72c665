"""Multimodal: questions about procedurally rendered scenes of coloured shapes.

A task carries only the scene's description (small, picklable); ``reset`` renders it with PIL and
puts the image into the user message as an HF content part ``{"type": "image", "image": ...}``.
The runner passes the episode's images to engines that take them (``generate(..., images=...)``)
and keeps them in ``Sample.images`` for the trainer.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hetrl.env.base import Message, Task
from hetrl.env.envs.single_answer import MathEnv
from hetrl.env.tasks.base import ProceduralSource

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40)}
KINDS = ("circle", "square", "triangle")
IMAGE_SIZE = 128
CELL = 32  # shapes sit in a 4x4 grid of cells so they never overlap (counting stays well defined)


MARGIN = 4  # pixels between a shape and its cell's edge; 0 with the source's ``fill`` option


def render_scene(shapes: list[dict[str, Any]], size: int = IMAGE_SIZE):
    """A PIL image of ``shapes`` (each {kind, colour, cell}, optionally margin) on a white background."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    per_row = size // CELL
    for shape in shapes:
        margin = shape.get("margin", MARGIN)
        left, top = (shape["cell"] % per_row) * CELL, (shape["cell"] // per_row) * CELL
        x0, y0 = left + margin, top + margin
        x1, y1 = min(x0 + CELL - 2 * margin, left + CELL - 1), min(y0 + CELL - 2 * margin, top + CELL - 1)
        fill = COLOURS[shape["colour"]]
        if shape["kind"] == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif shape["kind"] == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            draw.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=fill)
    return image


# count the shapes of a colour, of a kind, or all of them; or name the one colour all shapes share (by its number)
QUESTIONS = ("colour", "kind", "total", "which_colour")
COLOUR_CODES = sorted(COLOURS)  # which_colour's answers: 1 for the first, ...


def make_scene(
    rng: random.Random,
    questions: tuple[str, ...] = ("colour", "kind"),
    min_shapes: int = 2,
    max_shapes: int = 7,
    fill: bool = False,
) -> tuple[list[dict[str, Any]], str, str]:
    """(shapes, question, answer) for one seeded scene; the question is one of ``questions`` (:data:`QUESTIONS`).

    ``fill``: shapes reach their cell's edges (no margin), so more of each image patch shows their colour.
    """
    cells = rng.sample(range((IMAGE_SIZE // CELL) ** 2), rng.randint(min_shapes, max_shapes))
    shapes = [{"kind": rng.choice(KINDS), "colour": rng.choice(sorted(COLOURS)), "cell": c} for c in cells]
    if fill:
        shapes = [{**shape, "margin": 0} for shape in shapes]
    asked = rng.choice(questions)
    if asked == "colour":
        colour = rng.choice(sorted(COLOURS))
        question = f"How many {colour} shapes are in the image?"
        answer = str(sum(s["colour"] == colour for s in shapes))
    elif asked == "kind":
        kind = rng.choice(KINDS)
        question = f"How many shapes in the image are a {kind}?"
        answer = str(sum(s["kind"] == kind for s in shapes))
    elif asked == "total":
        question, answer = "How many shapes are in the image?", str(len(shapes))
    else:
        colour = rng.choice(COLOUR_CODES)
        shapes = [{**shape, "colour": colour} for shape in shapes]
        codes = ", ".join(f"{number} for {name}" for number, name in enumerate(COLOUR_CODES, 1))
        question, answer = f"What colour are the shapes? Answer {codes}.", str(COLOUR_CODES.index(colour) + 1)
    return shapes, question, answer


class ShapesSource(ProceduralSource):
    """Seeded scene questions; the answer is a number, as a string (a count, or which_colour's colour number).

    ``options`` (``env.tasks.options``): ``questions``, a subset of :data:`QUESTIONS` (default colour
    and kind); ``min_shapes``/``max_shapes`` per scene (default 2-7, at most 16 cells); ``fill``
    (shapes without a margin in their cells). ``answer_instruction`` follows each question (default:
    answer inside <answer></answer> tags; "" for none).
    """

    name = "shapes"

    ANSWER_INSTRUCTION = " Give the number inside <answer></answer> tags."

    def __init__(
        self, size: int, seed: int, options: dict[str, Any] | None = None, answer_instruction: str | None = None
    ) -> None:
        super().__init__(size, seed)
        self.answer_instruction = self.ANSWER_INSTRUCTION if answer_instruction is None else answer_instruction
        options = dict(options or {})
        self.questions = tuple(options.pop("questions", ("colour", "kind")))
        self.min_shapes, self.max_shapes = int(options.pop("min_shapes", 2)), int(options.pop("max_shapes", 7))
        self.fill = bool(options.pop("fill", False))
        if options:
            raise ValueError(
                f"shapes: unknown env.tasks.options {sorted(options)} (known: questions, min_shapes, max_shapes, fill)"
            )
        if not self.questions or set(self.questions) - set(QUESTIONS):
            raise ValueError(
                f"shapes: env.tasks.options.questions={list(self.questions)} must be a non-empty subset of "
                f"{list(QUESTIONS)}"
            )
        if not 1 <= self.min_shapes <= self.max_shapes <= (IMAGE_SIZE // CELL) ** 2:
            raise ValueError(
                f"shapes: need 1 <= min_shapes ({self.min_shapes}) <= max_shapes ({self.max_shapes}) <= "
                f"{(IMAGE_SIZE // CELL) ** 2}"
            )

    def make(self, rng: random.Random, index: int) -> Task:
        shapes, question, answer = make_scene(rng, self.questions, self.min_shapes, self.max_shapes, self.fill)
        return Task(
            task_id=f"shapes/{index}",
            source=self.name,
            messages=[{"role": "user", "content": question + self.answer_instruction}],
            answer=answer,
            metadata={"shapes": shapes},
        )


def swap_scenes(tasks: list[Task]) -> list[Task]:
    """The same questions and answers, each shown the next task's scene (the last one the first's).

    A policy that reads the image scores worse on these than on ``tasks``; one that answers from
    the question alone scores the same (``eval.image_ablation``).
    """
    scenes = [task.metadata for task in tasks[1:] + tasks[:1]]
    return [
        dataclasses.replace(task, task_id=f"{task.task_id}/swapped", metadata=scene)
        for task, scene in zip(tasks, scenes)
    ]


class MultimodalEnv(MathEnv):
    """Single-turn visual question answering, scored like math (the answer is a number)."""

    system_prompt = (
        "Look at the image and answer the question. Give only the final answer inside <answer></answer> tags."
    )

    async def reset(self, task: Task, seed: int) -> list[Message]:
        if "shapes" not in task.metadata:
            raise ValueError(f"task {task.task_id}: the multimodal env needs a scene (metadata['shapes'])")
        messages = await super().reset(task, seed)
        image = render_scene(task.metadata["shapes"])
        last = messages[-1]
        last["content"] = [{"type": "image", "image": image}, {"type": "text", "text": last["content"]}]
        return messages
