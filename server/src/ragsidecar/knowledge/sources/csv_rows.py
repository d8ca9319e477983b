"""CSV (.csv): one unit per row, each cell named by its header, with the lines the row spans and its id column."""

from __future__ import annotations

import csv
import io

from ragsidecar.knowledge.sources.units import ID_FIELDS, SOURCE_UNREADABLE, Provenance, SourceError, Unit


def csv_units(text: str, rel: str) -> list[Unit]:
    """A .csv file: the first row names the columns, every other non-empty row is a unit."""
    # The default field limit (128 KiB) would reject long text cells; the file size is already
    # bounded by max_bytes, so let a field be as long as the file. Only ever raised, never lowered.
    if csv.field_size_limit() < len(text) + 1:
        csv.field_size_limit(len(text) + 1)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        names = [name.strip() or f"column {i + 1}" for i, name in enumerate(header)]
        id_column = next((i for i, n in enumerate(names) if n.lower() in ID_FIELDS), None)
        units = []
        previous_line = reader.line_num
        for row in reader:
            line_start, previous_line = previous_line + 1, reader.line_num
            unit = _csv_row_unit(row, names, id_column, rel, line_start, reader.line_num)
            if unit is not None:
                units.append(unit)
    except csv.Error as e:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: malformed CSV near line {reader.line_num}: {e}") from e
    return units


def _csv_row_unit(
    row: list[str], names: list[str], id_column: int | None, rel: str, line_start: int, line_end: int
) -> Unit | None:
    # Cells past the header still carry content; name them by position rather than drop them.
    pairs = [(names[i] if i < len(names) else f"column {i + 1}", value.strip()) for i, value in enumerate(row)]
    text = "\n".join(f"{name}: {value}" for name, value in pairs if value)
    if not text:
        return None
    document_id = row[id_column].strip() if id_column is not None and id_column < len(row) else ""
    prov = Provenance(file=rel, document_id=document_id, line_start=line_start, line_end=line_end, char_end=len(text))
    return Unit(text, prov)
