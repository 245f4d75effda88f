//! What one join call asks for, shared by the logical node, the physical operator, the UDTF and
//! the DataFrame API: the selection (k or radius), the metric, the options, and how the two
//! inputs' columns map to the output columns.

use std::fmt;
use std::hash::{Hash, Hasher};

use arrow::datatypes::{DataType, Field, FieldRef, Schema};
use datafusion::common::config::{ConfigOptions, ExtensionOptions};
use datafusion::common::{plan_err, Result};

use crate::join::Selection;
use crate::metric::Metric;
use crate::options::{JoinOptions, SparseKnnConfig};
use crate::vector::{find_vector_column, Side, VectorCheck};

/// Output column holding the distance of each pair.
pub const DISTANCE_COLUMN: &str = "distance";
/// Output column holding the 1-based rank of each neighbour (knn_join only).
pub const RANK_COLUMN: &str = "rank";
/// Prefix of the left input's columns in the output.
pub const QUERY_PREFIX: &str = "query_";
/// Prefix of the right input's columns in the output.
pub const NEIGHBOR_PREFIX: &str = "neighbor_";

/// Which pairs a join keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JoinKind {
    /// The `k` nearest right rows of every left row.
    Knn { k: usize },
    /// Every pair within `radius` (for `dot`: at least `radius`).
    Radius { radius: f64 },
}

impl JoinKind {
    /// The SQL function name.
    pub fn function_name(&self) -> &'static str {
        match self {
            JoinKind::Knn { .. } => "knn_join",
            JoinKind::Radius { .. } => "radius_join",
        }
    }

    pub fn selection(&self) -> Selection {
        match *self {
            JoinKind::Knn { k } => Selection::Nearest(k),
            JoinKind::Radius { radius } => Selection::Within(radius),
        }
    }

    /// Checks `k` / `radius` for `metric`; errors say what is valid.
    pub fn check(&self, metric: &Metric) -> Result<()> {
        match *self {
            JoinKind::Knn { k: 0 } => {
                plan_err!("knn_join: k must be a whole number >= 1, got 0")
            }
            JoinKind::Radius { radius } if !radius.is_finite() => {
                plan_err!("radius_join: radius must be a finite number, got {radius}")
            }
            // A similarity threshold may be negative (dot >= -1 is a real question); a distance
            // radius below zero can only ever match nothing, so it is surely a mistake.
            JoinKind::Radius { radius } if radius < 0.0 && !metric.kind.is_similarity() => {
                plan_err!(
                    "radius_join: radius must be >= 0 for metric '{}', got {radius}",
                    metric.name()
                )
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for JoinKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinKind::Knn { k } => write!(f, "k={k}"),
            JoinKind::Radius { radius } => write!(f, "radius={radius}"),
        }
    }
}

/// What a call's options were parsed from, in order: the session's `sparse_knn.*` settings,
/// then each options string. Replaying it ([`OptionsSource::parse`]) goes through the same
/// parsers as planning did, so a plan serialised for a remote executor (`src/cluster`) carries
/// every option, including ones added later, as text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OptionsSource {
    /// `sparse_knn.*` settings as `(key without prefix, value)`.
    pub settings: Vec<(String, String)>,
    /// Options strings (`'key=value, ...'`), applied in order on top of the settings.
    pub texts: Vec<String>,
}

impl OptionsSource {
    /// The session's `sparse_knn.*` settings (none when the extension is not registered).
    pub fn from_session(config: &ConfigOptions) -> Self {
        let settings = config
            .extensions
            .get::<SparseKnnConfig>()
            .map(|c| {
                c.entries()
                    .into_iter()
                    .filter_map(|e| {
                        let key = e.key.strip_prefix("sparse_knn.").unwrap_or(&e.key);
                        Some((key.to_string(), e.value?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            settings,
            texts: Vec::new(),
        }
    }

    /// This source with one more options string on top.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.texts.push(text.into());
        self
    }

    /// The options, parsed again from the text.
    pub fn parse(&self) -> Result<JoinOptions> {
        let mut config = SparseKnnConfig::default();
        for (key, value) in &self.settings {
            ExtensionOptions::set(&mut config, key, value)?;
        }
        let mut options = JoinOptions::from_config(&config)?;
        for text in &self.texts {
            options = options.apply(text)?;
        }
        Ok(options)
    }
}

/// One join call: validated selection, metric and options.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinSpec {
    pub kind: JoinKind,
    pub metric: Metric,
    pub options: JoinOptions,
    /// The text `options` was parsed from (what a serialised plan carries).
    pub source: OptionsSource,
}

impl JoinSpec {
    /// Parses the metric with the options' `p`/`dim` and checks `k`/`radius`. The options'
    /// source is empty: give it with [`JoinSpec::with_source`] or use [`JoinSpec::parse`].
    pub fn new(kind: JoinKind, metric: &str, options: JoinOptions) -> Result<Self> {
        let metric = options
            .metric(metric)
            .map_err(|e| e.context(format!("{}: argument 3 (metric)", kind.function_name())))?;
        kind.check(&metric)?;
        Ok(Self {
            kind,
            metric,
            options,
            source: OptionsSource::default(),
        })
    }

    /// The spec whose options are parsed from `source` (settings, then options strings).
    pub fn parse(kind: JoinKind, metric: &str, source: OptionsSource) -> Result<Self> {
        let options = source.parse()?;
        Ok(Self::new(kind, metric, options)?.with_source(source))
    }

    /// Records the text the options were parsed from.
    pub fn with_source(mut self, source: OptionsSource) -> Self {
        self.source = source;
        self
    }

    pub fn function_name(&self) -> &'static str {
        self.kind.function_name()
    }

    /// The row checks a vector column must pass for this metric.
    pub fn vector_check(&self, column: &str) -> VectorCheck {
        VectorCheck::new(column)
            .with_dim(self.metric.dim)
            .with_nonnegative_for(
                self.metric
                    .kind
                    .needs_nonnegative()
                    .then(|| self.metric.name()),
            )
    }

    /// A stable text form of everything that defines the call (for Hash/Eq of plan nodes).
    pub(crate) fn key(&self) -> String {
        format!("{self:?}")
    }
}

impl Hash for JoinSpec {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl fmt::Display for JoinSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "metric={}, {}", self.metric, self.kind)?;
        if !self.options.exclude_self.is_off() {
            write!(f, ", exclude_self={}", self.options.exclude_self)?;
        }
        if let Some(column) = &self.options.within {
            write!(f, ", within={column}")?;
        }
        Ok(())
    }
}

/// How the two inputs' columns become the output columns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub left_vector: usize,
    pub right_vector: usize,
    /// Left columns copied to the output (as `query_<name>`), in input order.
    pub left_others: Vec<usize>,
    /// Right columns copied to the output (as `neighbor_<name>`), in input order.
    pub right_others: Vec<usize>,
    pub with_rank: bool,
}

impl Layout {
    /// Resolves the vector columns (by name when `*_vector_name` is given, else by type and the
    /// options) and lists the other columns.
    pub fn new(spec: &JoinSpec, left: &Schema, right: &Schema) -> Result<Self> {
        let function = spec.function_name();
        let left_vector = find_vector_column(
            function,
            Side::Left,
            left,
            spec.options.left_column.as_deref(),
        )?;
        let right_vector = find_vector_column(
            function,
            Side::Right,
            right,
            spec.options.right_column.as_deref(),
        )?;
        Ok(Self::with_vectors(
            spec,
            left,
            right,
            left_vector,
            right_vector,
        ))
    }

    /// The layout once the vector column of each side is known: every other column is copied.
    pub fn with_vectors(
        spec: &JoinSpec,
        left: &Schema,
        right: &Schema,
        left_vector: usize,
        right_vector: usize,
    ) -> Self {
        Self {
            left_vector,
            right_vector,
            left_others: (0..left.fields().len())
                .filter(|&i| i != left_vector)
                .collect(),
            right_others: (0..right.fields().len())
                .filter(|&i| i != right_vector)
                .collect(),
            with_rank: matches!(spec.kind, JoinKind::Knn { .. }),
        }
    }

    /// The output schema: `query_*`, `neighbor_*`, `distance` and (knn) `rank`.
    pub fn output_schema(&self, left: &Schema, right: &Schema) -> Schema {
        let renamed = |side: Side, f: &FieldRef| -> Field {
            f.as_ref()
                .clone()
                .with_name(format!("{}{}", column_prefix(side), f.name()))
        };
        let mut fields: Vec<Field> = self
            .left_others
            .iter()
            .map(|&i| renamed(Side::Left, &left.fields()[i]))
            .chain(
                self.right_others
                    .iter()
                    .map(|&i| renamed(Side::Right, &right.fields()[i])),
            )
            .collect();
        fields.push(Field::new(DISTANCE_COLUMN, DataType::Float64, false));
        if self.with_rank {
            fields.push(Field::new(RANK_COLUMN, DataType::Int32, false));
        }
        Schema::new(fields)
    }

    /// For projection pushdown: the input columns needed to produce `output` columns. The
    /// vector columns are always needed.
    pub fn required_inputs(&self, output: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let nl = self.left_others.len();
        let nr = self.right_others.len();
        let mut left = vec![self.left_vector];
        let mut right = vec![self.right_vector];
        for &o in output {
            if o < nl {
                left.push(self.left_others[o]);
            } else if o < nl + nr {
                right.push(self.right_others[o - nl]);
            }
        }
        left.sort_unstable();
        left.dedup();
        right.sort_unstable();
        right.dedup();
        (left, right)
    }
}

/// The prefix of an input's columns in the join's output.
fn column_prefix(side: Side) -> &'static str {
    match side {
        Side::Left => QUERY_PREFIX,
        Side::Right => NEIGHBOR_PREFIX,
    }
}
