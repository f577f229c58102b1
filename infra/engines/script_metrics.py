"""A script's metrics, with no SDK in the script: read from rank 0's lines and from the TensorBoard event files it
wrote, into one summary (script.json in its results folder) that the report, the ledger and MLflow read.

- `--metric NAME=REGEX` (script.metrics): each match of the regex in one of rank 0's lines is a value of NAME (its
  one group, a number); a regex that never matched is named in the summary's `unmatched`.
- The JSON line protocol: a line of rank 0 that is a JSON object with a `metrics` object of numbers, and optionally
  a `step`, is a value of each: `{"metrics": {"loss": 0.42, "accuracy": 0.87}, "step": 100}`.
- TensorBoard: every scalar of the event files (`events.out.tfevents.*`) under the run's logs/ and work/ folders,
  read with TensorBoard's own record format (no TensorFlow needed), by its tag: `train/accuracy`.

Whatever the script logs to MLflow itself (MLFLOW_TRACKING_URI and MLFLOW_RUN_ID are set) is in the same MLflow run.
"""

import json
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

Series = dict[str, list[tuple[int, float]]]  # metric -> (step, value) in the order found
EVENT_FILES = "events.out.tfevents.*"


def regex_metrics(lines: Iterable[str], patterns: dict[str, str]) -> tuple[Series, list[str]]:
    """The values each pattern matched in `lines` (its n-th match at step n), and the names that never matched."""
    compiled = {name: re.compile(pattern) for name, pattern in patterns.items()}
    found: Series = {name: [] for name in patterns}
    for line in lines:
        for name, regex in compiled.items():
            for match in regex.finditer(line):
                if (value := number(match.group(1))) is not None:
                    found[name].append((len(found[name]), value))
    return {n: v for n, v in found.items() if v}, [n for n, v in found.items() if not v]


def json_metrics(lines: Iterable[str]) -> Series:
    """The values of the JSON line protocol's lines, at their `step` (else at their count so far)."""
    found: Series = {}
    for line in lines:
        text = line.strip()
        if not (text.startswith("{") and '"metrics"' in text):
            continue
        try:
            record = json.loads(text)
        except ValueError:
            continue
        values = record.get("metrics") if isinstance(record, dict) else None
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            if (value := number(value)) is not None:
                series = found.setdefault(str(name), [])
                step = record.get("step")
                series.append((step if isinstance(step, int) else len(series), value))
    return found


def number(value: object) -> float | None:
    """A finite number from text or JSON, else None."""
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except ValueError:
        return None
    return result if result == result and abs(result) != float("inf") else None


def tensorboard_metrics(folders: Iterable[Path]) -> Series:
    """Every scalar of the event files under `folders`, by tag, in step order."""
    found: Series = {}
    for folder in folders:
        for path in sorted(folder.rglob(EVENT_FILES)) if folder.is_dir() else []:
            for tag, step, value in event_scalars(path):
                found.setdefault(tag, []).append((step, value))
    return {tag: sorted(values) for tag, values in found.items()}


def event_scalars(path: Path) -> Iterator[tuple[str, int, float]]:
    """(tag, step, value) of each scalar in one event file; a record cut short (a file still being written) ends it."""
    from tensorboard.compat.proto.event_pb2 import Event  # TensorBoard's copy of the protos: no TensorFlow import

    for record in tf_records(path.read_bytes()):
        event = Event()
        try:
            event.ParseFromString(record)
        except Exception:
            return
        for value in event.summary.value:
            if (scalar := scalar_of(value)) is not None:
                yield value.tag, int(event.step), scalar


def scalar_of(value) -> float | None:
    """A summary value's scalar: simple_value (torch's SummaryWriter), or a one-element float tensor (tf.summary)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    tensor = value.tensor if value.HasField("tensor") else None
    if tensor is None or tensor.tensor_shape.dim:
        return None
    if tensor.float_val:
        return float(tensor.float_val[0])
    if tensor.double_val:
        return float(tensor.double_val[0])
    if len(tensor.tensor_content) in (4, 8):
        return struct.unpack("<f" if len(tensor.tensor_content) == 4 else "<d", tensor.tensor_content)[0]
    return None


def tf_records(data: bytes) -> Iterator[bytes]:
    """The records of a TFRecord file: each a length (8 bytes), its CRC (4), the data and its CRC (4)."""
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        end = at + 12 + length + 4
        if end > len(data):
            return
        yield data[at + 12 : at + 12 + length]
        at = end


def read_metrics_of(log_lines: list[str], patterns: dict[str, str], folders: Iterable[Path]) -> dict:
    """The script's metrics from rank 0's lines (`log_lines`, prefixes removed) and its TensorBoard files: each
    series, where each came from, its last value, and the regexes that never matched."""
    regex, unmatched = regex_metrics(log_lines, patterns)
    sources = [("regex", regex), ("json", json_metrics(log_lines)), ("tensorboard", tensorboard_metrics(folders))]
    series: Series = {}
    source: dict[str, str] = {}
    for kind, found in sources:
        for name, values in found.items():
            if name not in series:
                series[name], source[name] = values, kind
    return {
        "series": {name: [list(point) for point in values] for name, values in series.items()},
        "from": source,
        "final": {name: values[-1][1] for name, values in series.items()},
        "unmatched": unmatched,
    }
