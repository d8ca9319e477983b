"""Knowledge sources: finding knowledge files and reading them into document-level units.

- `units`: what a reader yields (`Unit`, `Provenance`) and how it refuses a file (`SourceError`);
- `files`: finding a source's files (`list_files`) and reading one into units by its suffix (`read_units`,
  `inline_units`);
- one reader per format family: `plain_text` (.txt, .md), `json_records` (.json, .jsonl), `csv_rows`,
  `html_text`, `pdf_pages`.

Chunking splits units further; nothing here knows about tokens, indexes or gRPC.
"""
