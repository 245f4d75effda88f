//! Which column of an input holds its vectors: the `left_column` / `right_column` option, or
//! the one column of an accepted vector type.

use arrow::datatypes::{DataType, Schema};
use datafusion::common::{plan_err, Result};

use super::is_sparse_vector_type;

/// Which input a column belongs to, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Left,
    Right,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Left => "left",
            Side::Right => "right",
        }
    }

    pub fn option(self) -> &'static str {
        match self {
            Side::Left => "left_column",
            Side::Right => "right_column",
        }
    }
}

fn is_sparse_shaped(t: &DataType) -> bool {
    matches!(t, DataType::Struct(_) | DataType::Map(_, _))
}

/// Finds the vector column of one input: the `left_column`/`right_column` option when given,
/// else the one column of an accepted vector type. When several columns qualify and exactly one
/// of them is sparse-shaped (struct or map; the others being dense lists), that one is taken.
pub fn find_vector_column(
    function: &str,
    side: Side,
    schema: &Schema,
    chosen: Option<&str>,
) -> Result<usize> {
    let candidates: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| is_sparse_vector_type(schema.field(i).data_type()))
        .collect();
    let names = |idx: &[usize]| -> String {
        if idx.is_empty() {
            "none".to_string()
        } else {
            idx.iter()
                .map(|&i| format!("'{}'", schema.field(i).name()))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    if let Some(name) = chosen {
        let found = schema
            .fields()
            .iter()
            .position(|f| f.name() == name)
            .or_else(|| {
                schema
                    .fields()
                    .iter()
                    .position(|f| f.name().eq_ignore_ascii_case(name))
            });
        return match found {
            Some(i) if candidates.contains(&i) => Ok(i),
            Some(i) => plan_err!(
                "{function}: option {}='{name}': column of type {} is not a sparse vector; \
                 sparse vector columns of the {} input: {}",
                side.option(),
                schema.field(i).data_type(),
                side.name(),
                names(&candidates)
            ),
            None => plan_err!(
                "{function}: option {}='{name}': no such column in the {} input; \
                 sparse vector columns there: {}",
                side.option(),
                side.name(),
                names(&candidates)
            ),
        };
    }
    match candidates.as_slice() {
        [one] => Ok(*one),
        [] => plan_err!(
            "{function}: the {} input has no sparse vector column (expected \
             Struct{{indices: List<Int32>, values: List<Float32>}}, a Map<Int32, Float32> or a \
             dense List<Float32>); its columns: {}",
            side.name(),
            schema
                .fields()
                .iter()
                .map(|f| format!("{} {}", f.name(), f.data_type()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        many => {
            let sparse: Vec<usize> = many
                .iter()
                .copied()
                .filter(|&i| is_sparse_shaped(schema.field(i).data_type()))
                .collect();
            if let [one] = sparse.as_slice() {
                return Ok(*one);
            }
            plan_err!(
                "{function}: the {} input has several sparse vector columns ({}); pick one with \
                 the option {}=<name>",
                side.name(),
                names(many),
                side.option()
            )
        }
    }
}
