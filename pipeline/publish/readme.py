"""The results table: eval/results.md (a DVC output of the publish stage) and the README's
copy of it between two marker comments.

``results_table(metrics)`` is a pure function: one row per model, one column per test set,
each cell from the checkpoint trained for that set (``models/<model>@expanded-mnist.pt``
for expanded MNIST and affNIST, ``models/<model>.pt`` for MNIST, ...), the paper's number
beside ours. ``origin_line`` names the machine and commit of the run. ``replace_block``
checks the markers and swaps the block; ``update_readme`` rewrites a document's block.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from capsnet.config import dataset_specs
from capsnet.evaluation.headline import (
    AT_CHANCE,
    at_chance,
    cell_value,
    main_entries,
    model_picks,
    std_value,
    table_columns,
)
from capsnet.evaluation.results import Entry, EvalResults, Viewpoints
from capsnet.io.errors import CapsnetError
from capsnet.io.files import atomic_write_text, check_input, refuse_read_only
from pipeline.paper import SOURCES_LINE, paper_number
from pipeline.publish import comparison as comparison_text
from pipeline.publish.cells import column_title, paper_metric, percent, publishable

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
_BLOCK = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)


def _cell(column: str, model: str, entry: Entry) -> str:
    ours = percent(cell_value(entry, column), std_value(entry, column))
    paper = paper_number(paper_metric(column, entry), model)
    return ours + (f" ({paper.cite}: {percent(paper.accuracy)})" if paper else "")


def _source(model: str, entry: Entry) -> str:
    """Where a cell's number comes from, with the model's name as ``<model>``."""
    if entry.checkpoint is not None:
        path = Path(entry.checkpoint)
        return f"`{path.with_name(path.name.replace(model, '<model>', 1)).as_posix()}`"
    return f"the mean of {entry.seeds} seeds"


def _sources_line(picks: dict[str, dict[str, Entry]], titles: dict[str, str]) -> str:
    """One sentence naming, per group of columns, the checkpoint each cell comes from."""
    groups: dict[str, list[str]] = {}
    for column, title in titles.items():
        sources = {_source(m, chosen[column]) for m, chosen in picks.items() if column in chosen}
        groups.setdefault(" or ".join(sorted(sources)), []).append(title)
    parts = [f"{' and '.join(columns)} from {source}" for source, columns in groups.items()]
    return "Each cell is from the checkpoint trained for that set: " + "; ".join(parts) + "."


def _test_sizes(picks: dict[str, dict[str, Entry]]) -> str:
    sizes = {e.test_size(c) for chosen in picks.values() for c, e in chosen.items()}
    sizes.discard(None)
    if not sizes:
        return ""
    return "Test images per cell: " + ", ".join(f"{n:,}" for n in sorted(sizes)) + "."


def at_chance_line(
    metrics: EvalResults, picks: dict[str, dict[str, Entry]], titles: dict[str, str]
) -> str:
    """One sentence naming each checkpoint behind a cell (a seed of a mean, or a seed the
    mean left out as failed) whose accuracy is at chance (``headline.at_chance``); "" when
    there is none."""
    by_checkpoint = {e.checkpoint: name for name, e in metrics.entries.items() if e.checkpoint}
    found, left_out = {}, set()
    for chosen in picks.values():
        for column, entry in chosen.items():
            members = [by_checkpoint.get(c) for c in entry.checkpoints or (entry.checkpoint,)]
            left_out.update(entry.failed)
            for name in [*members, *entry.failed]:
                if name is not None and at_chance(metrics.entries[name], column):
                    value = cell_value(metrics.entries[name], column)
                    chance = dataset_specs.chance(column)
                    where = titles.get(column, column)
                    found[name, column] = (
                        f"{name} on {where}, {percent(value)} (chance {percent(chance)})"
                    )
    if not found:
        return ""
    failed = sorted(left_out & {name for name, _ in found})
    return (
        f"At chance (below {AT_CHANCE:g} times 1 / classes): " + "; ".join(found.values()) + "."
        + (f" Failed runs, left out of their means: {', '.join(failed)}." if failed else "")
        + (" No conclusion about a model follows from a cell that includes a run at chance."
           if set(n for n, _ in found) - left_out else "")
    )  # fmt: skip


def match_text(entry) -> str:
    """A kind's verdict, the stage's: "0.40% <= 1.00%: matched" (familiar-error gap against
    the tolerance, in test-error points)."""
    gap, tolerance = percent(entry.gap), percent(entry.tolerance)
    if entry.matched:
        return f"{gap} ≤ {tolerance}: matched"
    return f"{gap} > {tolerance}: not matched"


def viewpoints_lines(section: Viewpoints | None) -> list[str]:
    """The smallNORB novel-viewpoint comparison (test error at matched familiar error)."""
    if section is None:
        return []
    if section.skipped is not None:
        return [f"Novel smallNORB viewpoints: not run: {section.skipped.rstrip('.')}."]
    lines = [
        "| novel viewpoints | model | familiar error | novel error | target | familiar gap |",
        "|---|---|---|---|---|---|",
    ]
    for entry in section.kinds:
        if entry.skipped is not None:
            lines.append(f"| {entry.kind} | skipped: {entry.skipped} | | | | |")
            continue
        target = percent(entry.target_familiar_error)
        for m in entry.models:
            paper = m.paper_novel_error
            cite = f" (Hinton 2018, real smallNORB: {percent(paper)})" if paper else ""
            novel = percent(m.novel_error) + cite
            familiar = percent(m.familiar_error)
            lines.append(
                f"| {entry.kind} | {m.model} | {familiar} | {novel} | {target} | "
                f"{match_text(entry)} |"
            )
    chance = viewpoints_at_chance(section)
    return lines + seeds_lines(section) + (["", chance] if chance else [])


def viewpoints_at_chance(section: Viewpoints) -> str:
    """One sentence naming each novel-viewpoint run (kind, seed, model) whose familiar
    accuracy is at chance (``AT_CHANCE``), so its comparison and any mean over seeds that
    includes it support no conclusion; "" when there is none."""
    chance = dataset_specs.chance(dataset_specs.viewpoint_dataset())
    found = [
        f"{m.model} on {entry.kind}, familiar error {percent(m.familiar_error)}"
        for entry in section.kinds
        if entry.skipped is None
        for m in entry.models
        if chance is not None
        and m.familiar_error is not None
        and 1 - m.familiar_error < AT_CHANCE * chance
    ]
    if not found:
        return ""
    return (
        f"At chance (familiar accuracy below 1.25 times 1 / classes, error above "
        f"{percent(1 - AT_CHANCE * chance)}): " + "; ".join(found) + ". That run learned "
        "nothing, so no conclusion follows from its comparison or from a mean that includes it."
    )


def seeds_lines(section: Viewpoints) -> list[str]:
    """The novel-viewpoint errors as mean ± std over the seeds, per kind with more than
    one seed; none otherwise."""
    from capsnet.evaluation.novel_viewpoints import seeds_lines as sentences

    return [part for line in sentences(section, percent) for part in ("", line)]  # paragraphs


def results_table(metrics: EvalResults | dict, angle: float = 35.0) -> str:
    """The README's results in Markdown: test accuracy per model and test set (mean ± std
    over seeds where there are seeds), the paper's number in brackets, where each cell
    comes from, the seeds' comparison and the novel-viewpoint comparison. ``metrics`` is
    metrics.json typed (``load_results``) or its content, checked here."""
    metrics = publishable(metrics)
    entries = main_entries(metrics)
    columns = table_columns(entries, angle)
    titles = {c: column_title(c, entries) for c in columns}
    picks = model_picks(entries, columns)
    lines = ["| model | " + " | ".join(titles.values()) + " |", "|---|" + "---|" * len(columns)]
    for model, chosen in picks.items():
        cells = [_cell(c, model, chosen[c]) if c in chosen else "–" for c in columns]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    notes = [_sources_line(picks, titles), _test_sizes(picks), SOURCES_LINE] if columns else []
    notes.append(at_chance_line(metrics, picks, titles))
    text = "\n".join(lines) + "\n\n" + " ".join(n for n in notes if n)
    comparison = comparison_text.markdown(metrics.comparison, angle)
    viewpoints = viewpoints_lines(metrics.viewpoints)
    text = text.rstrip() + ("\n\n" + comparison if comparison else "")
    return text + ("\n\n" + "\n".join(viewpoints) if viewpoints else "")


#: How the origin line starts (tests compare tables without it).
ORIGIN_PREFIX = "Trained on "


def origin_line(origin: dict | None) -> str:
    """Where the numbers were made: the machine and the commit the run started from, and
    why another machine gets other trained numbers from the same data."""
    if not origin:
        return ""
    commit = origin.get("git_commit")
    where = f"commit `{commit[:12]}`" if commit else "an unknown commit"
    return (
        f"{ORIGIN_PREFIX}{origin.get('machine') or 'an unknown machine'}, from {where}. "
        "On another CPU kind the trained numbers differ (an AVX2 CPU trains in fp32, and "
        "each kind's kernels round differently); the data do not (every file's MD5 is checked)."
    )


def body(metrics: EvalResults | dict, figure: str | None = None, origin: dict | None = None) -> str:
    """The results table, the origin line and a link to ``figure``."""
    text = results_table(metrics)
    line = origin_line(origin)
    if line:
        text += f"\n\n{line}"
    if figure:
        text += f"\n\n![accuracy versus rotation]({figure})"
    return text


def block(
    metrics: EvalResults | dict, figure: str | None = None, origin: dict | None = None
) -> str:
    """What stands between the markers: ``body``."""
    return f"{BEGIN}\n{body(metrics, figure, origin)}\n{END}"


def current_block(text: str, where: str | os.PathLike = "README") -> str:
    """The marked block of ``text``; CapsnetError unless it has exactly one pair of markers."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise CapsnetError(f"{where}: needs one {BEGIN} line and, after it, one {END} line")
    return _BLOCK.search(text).group(0)


def read_document(path: str | os.PathLike) -> str:
    """The text of a document with a results block, checked before anything is written:
    it exists, has one pair of markers and may be written (CapsnetError otherwise)."""
    path = Path(path)
    check_input(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, PermissionError) as exc:
        raise CapsnetError(f"{path}: not a readable text file ({exc.__class__.__name__})") from None
    current_block(text, path)
    refuse_read_only(path)
    return text


def replace_block(text: str, new_block: str, where: str | os.PathLike = "README") -> str:
    """``text`` with its results block replaced by ``new_block``."""
    return text.replace(current_block(text, where), new_block, 1)


def update_readme(
    readme: str | os.PathLike,
    metrics: str | os.PathLike,
    figure: str | None = None,
    origin: dict | None = None,
) -> bool:
    """Rewrite ``readme``'s results block from ``metrics`` (atomically); whether it changed."""
    text = read_document(readme)
    new = replace_block(text, block(publishable(metrics), figure, origin), readme)
    if new == text:
        return False
    atomic_write_text(readme, new)
    return True


if __name__ == "__main__":  # python -m pipeline.publish.readme DOC METRICS [FIGURE]
    import sys

    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python -m pipeline.publish.readme DOC METRICS [FIGURE]")
    try:
        changed = update_readme(sys.argv[1], sys.argv[2], *sys.argv[3:])
    except CapsnetError as exc:
        sys.exit(f"error: {exc}")
    print(f"{sys.argv[1]}: results table {'updated' if changed else 'unchanged'}")
