#!/usr/bin/env python3
"""Write the example datasets bundled in data/ from the full files in ../shared/data.

Usage, from the repository root:  python3 scripts/make_data_cuts.py [SOURCE_DIR] [OUT_DIR]
(defaults ../shared/data and data). Needs pyarrow (pip install pyarrow).

The cuts are chosen by row position or id, never at random, so the same sources give the same
rows; with the same pyarrow version the files are byte-identical. The repository's tests, docs
and sql-examples hold figures computed on these exact rows: changing a cut means re-running
`cargo test --release` and updating what it reports.

- kos_bow.parquet: all 3430 KOS entries (small enough whole; tests/fixtures and the slt files
  hold scipy figures for it).
- sec_edgar_names.parquet: the first 10,000 names by name_id (the company list is alphabetical,
  so this is '!J INC' through the 'AC...' names; the 'AB%' names of sql-examples/03 are all in).
- pbmc_facs_counts.parquet: every 3rd cell (the source order is already shuffled, so every cell
  type keeps its share).
- news20_bow.parquet: every 3rd post of the train split and every 15th of the test split, by
  doc_id order, all 173,762 vocabulary columns kept (indices are unchanged, so the source's
  news20_vocab.txt still names them); news20_vocab.parquet: (word_id, word) for just the words
  that occur in the cut.
"""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def write(table: pa.Table, path: Path, source: str, dim: int | None) -> None:
    meta = {b"source": source.encode()}
    if dim is not None:
        meta[b"dim"] = str(dim).encode()
    table = table.replace_schema_metadata(meta)
    # One row group, zstd at a high level: these files live in git, size matters more than
    # write time; statistics off keeps them smaller still and readers do not need them here.
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=19,
        row_group_size=max(table.num_rows, 1),
        write_statistics=False,
    )


def every_nth(table: pa.Table, n: int) -> pa.Table:
    return table.take(pa.array(range(0, table.num_rows, n), pa.int64()))


def nnz(table: pa.Table) -> int:
    return len(pc.list_flatten(table.column("vec").combine_chunks().field("indices")))


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "data")
    out.mkdir(parents=True, exist_ok=True)

    kos = pq.read_table(src / "kos_bow.parquet")
    write(
        kos,
        out / "kos_bow.parquet",
        "UCI Bag of Words, KOS blog entries: word counts, 3430 docs x 6906 words (CC BY 4.0)",
        None,
    )

    names = pq.read_table(src / "sec_edgar_names_100k.parquet")
    names = names.filter(pc.less(names.column("name_id"), 10_000))
    write(
        names,
        out / "sec_edgar_names.parquet",
        "First 10,000 (alphabetical) names of the SEC EDGAR company list (public data), "
        "via the PolyFuzz repository",
        None,
    )

    facs = every_nth(pq.read_table(src / "pbmc_facs_counts.parquet"), 3)
    write(
        facs,
        out / "pbmc_facs_counts.parquet",
        f"Zheng et al. 2017 FACS-purified PBMC UMI counts (10x), every 3rd of 3774 cells: "
        f"{facs.num_rows} cells x 16791 genes, cell types labelled (CC BY 4.0)",
        16791,
    )

    news = pq.read_table(src / "news20_bow.parquet")
    news = news.sort_by("doc_id")
    train = every_nth(news.filter(pc.equal(news.column("split"), "train")), 3)
    test = every_nth(news.filter(pc.equal(news.column("split"), "test")), 15)
    news = pa.concat_tables([train, test]).sort_by("doc_id")
    write(
        news,
        out / "news20_bow.parquet",
        "20 Newsgroups (bydate), word counts built from the raw posts: lowercased, tokens "
        "\\b\\w\\w+\\b, headers kept; every 3rd train and every 15th test post: "
        f"{news.num_rows} docs x 173762 words; words in news20_vocab.parquet",
        173762,
    )

    words = (src / "news20_vocab.txt").read_text(encoding="utf-8").split("\n")
    used = sorted(set(pc.list_flatten(news.column("vec").combine_chunks().field("indices")).to_pylist()))
    vocab = pa.table(
        {
            "word_id": pa.array(used, pa.int32()),
            "word": pa.array([words[i] for i in used], pa.string()),
        }
    )
    write(
        vocab,
        out / "news20_vocab.parquet",
        "Vocabulary of news20_bow.parquet: word_id = the vector index, only the words that occur",
        None,
    )

    for f in sorted(out.glob("*.parquet")):
        t = pq.read_table(f)
        extra = ""
        if "vec" in t.column_names:
            extra = f", nnz {nnz(t)}"
        print(f"{f}: {t.num_rows} rows{extra}, {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
