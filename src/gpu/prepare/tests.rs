//! The host's preparation against plain definitions: the device-built part's host half, the
//! inverted index, the dense columns' choice and flags.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::dense::DENSE_MAC_COST;
use super::*;
use crate::metric::{Metric, MetricKind, Semiring};

/// Rows `start..end` of `right` prepared for `metric` over direct column ids below `ncols`.
fn part_of(
    right: &SparseBatch,
    metric: &Metric,
    ncols: usize,
    (start, end): (usize, usize),
    tile_rows: usize,
    lists_on_device: bool,
) -> HostPart {
    crate::with_semiring!(metric, s => {
        let totals: Vec<RowTotals> = (0..right.len())
            .map(|r| s.totals(right.row(r).1.iter().copied().filter(|x| *x != 0.0)))
            .collect();
        let program = MetricProgram::of(&s);
        let shape = PartShape {
            program: &program,
            columns: &ColumnMap::Direct(ncols),
            tile_rows,
            dense: None,
            lists_on_device,
        };
        prepare_part(right, &totals, start, end, &shape)
    })
}

/// A part that leaves its lists for the device: the host's half (what sizes the device's
/// lists, a max's ranks in CSR order, the tiles, everything else) agrees with the host's own
/// build of the same rows, null rows keeping entries in their ranges included (the device
/// skips those rows, as the host's build does).
#[test]
fn a_part_left_for_the_device_agrees_with_the_hosts_build() {
    use arrow::buffer::NullBuffer;
    let mut rng = StdRng::seed_from_u64(7);
    let (mut offsets, mut indices, mut values, mut valid) = (vec![0i32], vec![], vec![], vec![]);
    for r in 0..700 {
        let deg = if r % 50 == 0 {
            60
        } else {
            rng.random_range(0..12)
        };
        for c in 0..deg {
            indices.push(c * 7 + r % 7);
            // stored zeros and ties among the largest values
            values.push(rng.random_range(0..6) as f32 * if r % 2 == 0 { 1.0 } else { -0.5 });
        }
        offsets.push(indices.len() as i32);
        valid.push(r % 9 != 4);
    }
    let right = SparseBatch::from_parts(
        offsets.into(),
        indices.into(),
        values.into(),
        Some(NullBuffer::from(valid)),
    );
    let ncols = right.max_dim();
    for kind in [MetricKind::Cosine, MetricKind::Chebyshev] {
        let metric = Metric::from_kind(kind, None, None).unwrap();
        for (start, end) in [(0, 700), (130, 521)] {
            let [host, left] = [false, true]
                .map(|on_device| part_of(&right, &metric, ncols, (start, end), 64, on_device));
            let at = format!("{kind} rows {start}..{end}");
            assert!(
                host.device_lists.is_none() && left.tile_ptr.is_empty(),
                "{at}"
            );
            let lists = left.device_lists.expect("lists left for the device");
            assert_eq!(lists.entries, host.col_entries.len(), "{at}: entries");
            assert_eq!(lists.ncols, ncols, "{at}");
            assert_eq!(left.ntiles, host.ntiles, "{at}");
            assert_eq!(
                left.device_bytes(),
                host.device_bytes(),
                "{at}: device bytes"
            );
            assert_eq!((left.y_min, left.y_max), (host.y_min, host.y_max), "{at}");
            assert_eq!(
                (&left.rt0, &left.valid_bits),
                (&host.rt0, &host.valid_bits),
                "{at}"
            );
            assert_eq!(left.r_top, host.r_top, "{at}: largest values");
            if kind == MetricKind::Chebyshev {
                // Each listed entry's rank, read at its CSR position, is the one the host
                // placed beside it (entries of valid rows, in the host's column order).
                let base = right.offsets()[start] as usize;
                let mut by_column: Vec<Vec<(u32, u8)>> = vec![Vec::new(); ncols];
                for r in start..end {
                    let (idx, val) = right.row(r);
                    let at_row = right.offsets()[r] as usize - base;
                    for (e, (&c, &v)) in idx.iter().zip(val).enumerate() {
                        if v != 0.0 {
                            let rank = left.entry_ranks[at_row + e];
                            by_column[c as usize].push(((r - start) as u32, rank));
                        }
                    }
                }
                let listed: Vec<(u32, u8)> = by_column.concat();
                let hosts: Vec<(u32, u8)> = host
                    .col_entries
                    .iter()
                    .zip(&host.col_ranks)
                    .map(|(&entry, &rank)| (entry as u32, rank))
                    .collect();
                assert_eq!(listed, hosts, "{at}: ranks");
            } else {
                assert!(left.entry_ranks.is_empty(), "{at}");
            }
        }
    }
}

/// The parallel CSC (counts, column starts per chunk cut at equal entries, fill) against the
/// plain one: every column's entries in row order, and each tile's split point; for the whole
/// batch and for parts of it (a range starting inside, one ending in a run of empty rows, one
/// of empty rows only), on one core and on several.
#[test]
fn the_inverted_index_equals_a_plain_transpose() {
    let ncols = 10_000usize; // more than one block of columns
    let mut rng = StdRng::seed_from_u64(12345);
    let mut rows: Vec<Vec<(i32, f32)>> = (0..3_000)
        .map(|r| {
            // Power-law degrees, so that equal rows and equal entries cut differently.
            let deg = if r % 97 == 0 {
                900
            } else {
                rng.random_range(0..40)
            };
            let mut cols: Vec<i32> = (0..deg)
                .map(|_| rng.random_range(0..ncols as i32))
                .collect();
            // A popular column, in many rows of every tile.
            if r % 3 == 0 {
                cols.push(7);
            }
            cols.sort_unstable();
            cols.dedup();
            // Some stored zeros, which the index leaves out.
            cols.into_iter()
                .map(|c| (c, rng.random_range(0..5) as f32))
                .collect()
        })
        .collect();
    rows.extend(std::iter::repeat_n(Vec::new(), 50));
    let right = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let metric = Metric::from_kind(MetricKind::Cosine, None, None).unwrap();
    let tile_rows = 256;
    let n = rows.len();
    for (start, end) in [(0, n), (1_234, 2_900), (2_500, n), (3_010, n)] {
        for threads in [1, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let part =
                pool.install(|| part_of(&right, &metric, ncols, (start, end), tile_rows, false));
            let mut columns: Vec<Vec<(u32, f32)>> = vec![Vec::new(); ncols];
            for (r, row) in rows[start..end].iter().enumerate() {
                for &(c, v) in row {
                    if v != 0.0 {
                        columns[c as usize].push((r as u32, v));
                    }
                }
            }
            let ntiles = part.ntiles;
            let at = format!("rows {start}..{end} on {threads} threads");
            let magnitudes = || {
                rows[start..end]
                    .iter()
                    .flatten()
                    .map(|&(_, v)| v.abs() as f64)
                    .filter(|&a| a != 0.0)
            };
            let y_min = magnitudes().fold(f64::INFINITY, f64::min);
            let y_max = magnitudes().fold(0.0, f64::max);
            assert_eq!(
                (part.y_min, part.y_max),
                (if y_min.is_finite() { y_min } else { 0.0 }, y_max),
                "{at}"
            );
            assert_eq!(ntiles, (end - start).div_ceil(tile_rows).max(1), "{at}");
            for (c, want) in columns.iter().enumerate() {
                let tp = &part.tile_ptr[c * (ntiles + 1)..(c + 1) * (ntiles + 1)];
                let (s, e) = (tp[0] as usize, tp[ntiles] as usize);
                let got: Vec<(u32, f32)> = (s..e)
                    .map(|i| {
                        let entry = part.col_entries[i];
                        (entry as u32, f32::from_bits((entry >> 32) as u32))
                    })
                    .collect();
                assert_eq!(&got, want, "column {c}, {at}");
                for t in 0..ntiles {
                    let inside = &part.col_entries[tp[t] as usize..tp[t + 1] as usize];
                    assert!(
                        inside.iter().all(|&e| (e as u32) as usize / tile_rows == t),
                        "column {c}, tile {t}, {at}"
                    );
                }
            }
        }
    }
}

/// Rows whose column c (of 0..8) is nonzero in about (8 - c) / 8 of them, plus sparse
/// columns 100.. each in a few rows; values are counts, or fractions where `fractions`.
fn shares_batch(rows: usize, fractions: bool) -> SparseBatch {
    let mut rng = StdRng::seed_from_u64(7);
    let rows: Vec<Vec<(i32, f32)>> = (0..rows)
        .map(|r| {
            let mut row: Vec<(i32, f32)> = (0..8)
                .filter(|c| (r % 8) < 8 - *c as usize)
                .map(|c| {
                    let v = rng.random_range(1..100) as f32;
                    (c, if fractions { v / 7.0 } else { v })
                })
                .collect();
            row.push((100 + (r % 5000) as i32, 1.0));
            row
        })
        .collect();
    SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())))
}

#[test]
fn dense_columns_are_the_densest_within_the_choice_and_memory() {
    use crate::options::DenseColumnChoice;
    let right = shares_batch(4000, false);
    let columns = ColumnMap::Direct(right.max_dim());
    let unlimited = u64::MAX;
    assert!(choose_dense_columns(&right, &columns, DenseColumnChoice::Off, unlimited).is_none());
    // Shares 1, 7/8, ..., 1/8: at least 0.3 takes columns 0..=5 (6/8 = 0.75 .. 3/8).
    let d = choose_dense_columns(
        &right,
        &columns,
        DenseColumnChoice::MinShare(0.3),
        unlimited,
    )
    .unwrap();
    assert_eq!(d.count, 6);
    assert_eq!(d.kp, DENSE_TILE_K);
    assert_eq!(
        d.flags, 0,
        "counts below 100 are TF32 numbers, half- and 8-bit-exact"
    );
    for c in 0..columns.len() {
        assert_eq!(d.slot[c] >= 0, c < 6, "column {c}");
    }
    // The slots are in order of share (densest first).
    assert_eq!(&d.slot[..6], &[0, 1, 2, 3, 4, 5]);
    // Auto: counts need one TF32 pass; every column with share² above its cost is taken.
    let auto = choose_dense_columns(&right, &columns, DenseColumnChoice::Auto, unlimited).unwrap();
    assert_eq!(auto.count, 8);
    // Fractions need the split product (three passes): the same columns still pay here.
    let split = shares_batch(4000, true);
    let auto = choose_dense_columns(&split, &columns, DenseColumnChoice::Auto, unlimited).unwrap();
    assert_eq!(auto.count, 8);
    assert_eq!(auto.flags, DENSE_NOT_TF32 | DENSE_NOT_HALF | DENSE_NOT_INT8);
    // Uniformly sparse columns are not worth a product.
    let sparse_rows: Vec<Vec<(i32, f32)>> = (0..4000).map(|r| vec![(r % 3000, 2.0)]).collect();
    let sparse = SparseBatch::from_rows(sparse_rows.iter().map(|r| Some(r.as_slice())));
    let sparse_cols = ColumnMap::Direct(sparse.max_dim());
    assert!(
        choose_dense_columns(&sparse, &sparse_cols, DenseColumnChoice::Auto, unlimited).is_none()
    );
    // Memory is counted in whole tiles of columns (64 of 4,096 padded rows, 6 bytes each).
    let tile = 4096 * 6 * DENSE_TILE_K as u64;
    let d = choose_dense_columns(&right, &columns, DenseColumnChoice::MinShare(0.1), tile).unwrap();
    assert_eq!(d.count, 8);
    assert!(
        choose_dense_columns(&right, &columns, DenseColumnChoice::MinShare(0.1), tile - 1)
            .is_none()
    );
    // A column with a value outside the product's range stays sparse.
    let mut rows: Vec<Vec<(i32, f32)>> = (0..100).map(|_| vec![(0, 1.0), (1, 2.0)]).collect();
    rows[50][1].1 = 3.0e12;
    let odd = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let d = choose_dense_columns(
        &odd,
        &ColumnMap::Direct(2),
        DenseColumnChoice::MinShare(0.5),
        unlimited,
    )
    .unwrap();
    assert_eq!((d.count, d.slot[0], d.slot[1]), (1, 0, -1));
    // The flags are those of the chosen columns only.
    let rows: Vec<Vec<(i32, f32)>> = (0..100)
        .map(|r| {
            let mut row = vec![(0, 3.0)];
            if r % 3 == 0 {
                row.push((1, 0.1 + r as f32));
            }
            row
        })
        .collect();
    let mixed = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let columns2 = ColumnMap::Direct(2);
    let only_counts = choose_dense_columns(
        &mixed,
        &columns2,
        DenseColumnChoice::MinShare(0.5),
        unlimited,
    )
    .unwrap();
    assert_eq!((only_counts.count, only_counts.flags), (1, 0));
    let both = choose_dense_columns(
        &mixed,
        &columns2,
        DenseColumnChoice::MinShare(0.2),
        unlimited,
    )
    .unwrap();
    assert_eq!(
        (both.count, both.flags),
        (2, DENSE_NOT_HALF | DENSE_NOT_TF32 | DENSE_NOT_INT8)
    );
}

#[test]
fn flags_say_which_values_are_tf32_numbers_and_small_integers() {
    for v in [255.0f32, 1000.0, 2047.0, 2048.0, -2048.0] {
        assert_eq!(dense_flags(v), DENSE_NOT_INT8, "{v}");
    }
    for v in [1.0f32, 2.0, 127.0, -127.0] {
        assert_eq!(dense_flags(v), 0, "{v}");
    }
    for v in [128.0f32, 255.0, 2048.0, -2000.0] {
        assert_eq!(dense_flags(v), DENSE_NOT_INT8, "{v}");
    }
    let not_small = DENSE_NOT_HALF | DENSE_NOT_INT8;
    assert_eq!(dense_flags(0.5), not_small);
    assert_eq!(dense_flags(2049.0), not_small | DENSE_NOT_TF32);
    assert_eq!(dense_flags(4096.0), not_small);
    assert_eq!(dense_flags(0.1), not_small | DENSE_NOT_TF32);
    assert_eq!(fast_kind(0, 64), FastKind::Int8);
    assert_eq!(fast_kind(0, 200_000), FastKind::Half);
    assert_eq!(fast_kind(DENSE_NOT_INT8, 64), FastKind::Half);
    assert_eq!(fast_kind(not_small, 64), FastKind::None);
}

/// `dense_flags` without branches gives what its plain definition (a `round`) gives.
#[test]
fn dense_flags_equal_their_plain_definition() {
    let plain = |v: f32| -> u32 {
        let mut f = if v.to_bits() & 0x1fff != 0 {
            DENSE_NOT_TF32
        } else {
            0
        };
        let whole = v == v.round();
        if !(whole && v.abs() <= 2048.0) {
            f |= DENSE_NOT_HALF;
        }
        if !(whole && v.abs() <= 127.0) {
            f |= DENSE_NOT_INT8;
        }
        f
    };
    let mut rng = StdRng::seed_from_u64(3);
    let specials = [
        0.0,
        -0.0,
        0.5,
        1.0,
        -1.0,
        126.5,
        127.0,
        127.5,
        128.0,
        -127.0,
        -128.0,
        2047.5,
        2048.0,
        2048.5,
        2049.0,
        -2048.0,
        1e10,
        -1e10,
        1e-40,
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        16777216.0,
        3e9,
    ];
    let values = specials
        .into_iter()
        .chain((-5000..5000).map(|i| i as f32 * 0.5))
        .chain((0..100_000).map(|_| f32::from_bits(rng.random::<u32>())))
        .collect::<Vec<f32>>()
        .into_iter()
        .chain((0..10_000).map(|_| rng.random_range(-3000.0f32..3000.0)));
    for v in values {
        assert_eq!(dense_flags(v), plain(v), "{v} ({:#x})", v.to_bits());
    }
}

/// The dense columns chosen, against a plain count: by share (`MinShare`), and by the cost
/// model (`Auto`) on rows where three columns are in every row; a column holding a value
/// outside the product's range is never taken, and the flags are those of the taken
/// columns' values.
#[test]
fn dense_columns_follow_a_plain_count() {
    use crate::options::DenseColumnChoice;
    let mut rng = StdRng::seed_from_u64(9);
    let ncols = 300;
    let rows: Vec<Vec<(i32, f32)>> = (0..4_000)
        .map(|r| {
            let mut cols: Vec<i32> = vec![0, 1, 2, if r == 77 { 5 } else { 0 }];
            cols.extend((0..rng.random_range(0..12)).map(|_| {
                // A few popular columns, then a long tail.
                if rng.random_bool(0.5) {
                    rng.random_range(3..10)
                } else {
                    rng.random_range(10..ncols as i32)
                }
            }));
            cols.sort_unstable();
            cols.dedup();
            cols.into_iter()
                .map(|c| {
                    let v = match c {
                        // Column 5 holds one value beyond the product's range.
                        5 if r == 77 => 1e20,
                        // Column 4 holds fractions, the rest counts and some stored zeros.
                        4 => 0.25 * rng.random_range(1..9) as f32,
                        _ => rng.random_range(0..6) as f32,
                    };
                    (c, v)
                })
                .collect()
        })
        .collect();
    let right = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let columns = ColumnMap::Direct(ncols);
    let mut counts = vec![0u64; ncols];
    for row in &rows {
        for &(c, v) in row {
            counts[c as usize] += u64::from(v != 0.0);
        }
    }
    let flags_of = |cols: &[usize]| {
        rows.iter()
            .flatten()
            .filter(|(c, v)| *v != 0.0 && cols.contains(&(*c as usize)))
            .fold(0, |f, &(_, v)| f | dense_flags(v))
    };
    let mut order: Vec<usize> = (0..ncols).filter(|&c| c != 5 && counts[c] > 0).collect();
    order.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
    let share = |c: usize| counts[c] as f64 / rows.len() as f64;
    let by_share: Vec<usize> = order.iter().copied().filter(|&c| share(c) >= 0.2).collect();
    let d = choose_dense_columns(&right, &columns, DenseColumnChoice::MinShare(0.2), u64::MAX)
        .expect("columns of share 0.2 and more");
    assert_eq!(d.count, by_share.len());
    for (i, &c) in by_share.iter().enumerate() {
        assert_eq!(d.slot[c], i as i32, "column {c}");
    }
    assert_eq!(d.slot.iter().filter(|&&s| s >= 0).count(), by_share.len());
    assert_eq!(d.flags, flags_of(&by_share));
    assert_eq!(d.slot[5], -1, "the column with a value out of range");
    // Auto: column 4's fractions make the flags "not 8-bit, not half" (three passes).
    let passes = 3.0;
    let auto: Vec<usize> = order
        .iter()
        .copied()
        .take_while(|&c| share(c) * share(c) > DENSE_MAC_COST * passes)
        .collect();
    assert!(auto.len() >= 3, "{auto:?}");
    let d = choose_dense_columns(&right, &columns, DenseColumnChoice::Auto, u64::MAX)
        .expect("three columns in every row");
    assert_eq!(d.count, auto.len());
    for (i, &c) in auto.iter().enumerate() {
        assert_eq!(d.slot[c], i as i32, "column {c}");
    }
    assert_eq!(d.flags, flags_of(&auto));
}

#[test]
fn a_column_profile_is_the_same_over_any_pieces_and_survives_its_bytes() {
    let mut rng = StdRng::seed_from_u64(7);
    // Raw counts in the thousands, a value outside the dense range, and a column index space
    // large enough for a sorted map in the second case.
    for spread in [1i32, 1 << 22] {
        let rows: Vec<Vec<(i32, f32)>> = (0..3000)
            .map(|r| {
                let mut cols: Vec<i32> = (0..rng.random_range(0..40))
                    .map(|_| rng.random_range(0..500) * spread)
                    .collect();
                cols.sort_unstable();
                cols.dedup();
                cols.into_iter()
                    .map(|c| {
                        let v = if r == 1234 && c == 0 {
                            5.0e12
                        } else {
                            rng.random_range(0..4000) as f32 * 0.5
                        };
                        (c, v)
                    })
                    .collect()
            })
            .collect();
        let whole = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let pieces: Vec<SparseBatch> = [0..1, 1..700, 700..701, 701..3000]
            .into_iter()
            .map(|r| SparseBatch::from_rows(rows[r].iter().map(|r| Some(r.as_slice()))))
            .collect();
        let columns = ColumnMap::of(std::slice::from_ref(&whole));
        assert_eq!(ColumnMap::of(&pieces), columns);
        assert_eq!(matches!(columns, ColumnMap::Sorted(_)), spread > 1);
        let profile = ColumnProfile::of(std::slice::from_ref(&whole), columns.clone());
        assert_eq!(ColumnProfile::of(&pieces, columns.clone()), profile);
        // Its counts and flags are the plain definitions, column by column.
        for c in 0..columns.len() {
            let id = c as u32;
            let values: Vec<f32> = rows
                .iter()
                .flatten()
                .filter(|(i, v)| columns.get(*i) == Some(id) && *v != 0.0)
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(profile.counts[c], values.len() as u64);
            assert_eq!(
                profile.flags[c],
                values.iter().fold(0, |f, &v| f | dense_flags(v))
            );
            assert_eq!(
                profile.bad[c],
                values.iter().any(|&v| !dense_value_ok(v)),
                "column {c}"
            );
        }
        let mut bytes = Vec::new();
        profile.write_to(&mut bytes).unwrap();
        assert_eq!(ColumnProfile::read_from(&bytes).unwrap(), profile);
        assert!(ColumnProfile::read_from(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ColumnProfile::read_from(&longer).is_err());
    }
}

/// A stored zero in a column where no row has a nonzero: the sorted map leaves the column out
/// (it has no list), and the profile passes over the entry.
#[test]
fn a_stored_zero_outside_the_map_is_passed_over() {
    let rows: Vec<Vec<(i32, f32)>> = vec![
        vec![(3, 1.0), (1 << 30, 2.0)],
        vec![(5, 0.0), (1 << 29, 4.0)],
    ];
    let batch = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let columns = ColumnMap::of(std::slice::from_ref(&batch));
    assert_eq!(columns, ColumnMap::Sorted(vec![3, 1 << 29, 1 << 30]));
    let profile = ColumnProfile::of(std::slice::from_ref(&batch), columns);
    assert_eq!(profile.counts, vec![1, 1, 1]);
}
