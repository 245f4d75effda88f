//! The CUDA C of one metric, generated from its definition (see [`crate::semiring!`]): a struct
//! `MetricDef` whose static functions are the definition's formulas, verbatim. The generic
//! kernels in `kernels/knn.cu` call only these, so no metric formula is written in CUDA by hand.

use super::define::{Reduction, Semiring};

fn lets(bindings: &[(&str, &str)]) -> String {
    bindings
        .iter()
        .map(|(name, value)| format!("const double {name} = {value}; "))
        .collect()
}

/// Whether the formula text reads `what` (e.g. `r.t0`), ignoring the spacing of `stringify!`.
fn reads(text: &str, what: &str) -> bool {
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let bytes = squeezed.as_bytes();
    squeezed.match_indices(what).any(|(at, _)| {
        // Not the tail of a longer name (`for.t0` must not match `r.t0`).
        at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_')
    })
}

/// The `MetricDef` struct (and `METRIC_REDUCTION_MAX`) for `S`, ready to be placed between the
/// kernel prelude and the generic kernels.
pub fn cuda_definition<S: Semiring>() -> String {
    let src = S::SOURCE;
    let [tx, tprm] = src.total_names;
    let [px, py, pprm] = src.pair_names;
    let [acc0, acc1, l, r, fprm] = src.finish_names;
    // Both values' lifts come computed: the left value's is the same for every posting of its
    // column's list, so the kernels compute it once per left entry, and the right value's once
    // per posting of the right side's lists when they are made (`entry_lifts`, read beside the
    // entry in one more coalesced load): a logarithm (jensenshannon, kl_divergence) or square
    // root (hellinger) a pair fewer, the same bits as computing them in place (`pair0`).
    let (lift, plets, lifted_lets, lx_name, ly_name) = match src.lift {
        Some(([v, lprm], text, [lx, ly])) => (
            format!(
                "    __device__ static double lift(double {v}, const Params& {lprm}) \
                 {{ return {text}; }}\n"
            ),
            format!(
                "const double {lx} = lift({px}, {pprm}); const double {ly} = lift({py}, {pprm}); {}",
                lets(src.pair_lets)
            ),
            lets(src.pair_lets),
            lx,
            ly,
        ),
        None => (
            "    __device__ static double lift(double, const Params&) { return 0.0; }\n"
                .to_string(),
            lets(src.pair_lets),
            lets(src.pair_lets),
            "lift_x_unused",
            "lift_y_unused",
        ),
    };
    let flets = lets(src.finish_lets);
    let finish_text = format!("{flets} {}", src.finish);
    let needs_rt0 = reads(&finish_text, &format!("{r}.t0"));
    let needs_rt1 = reads(&finish_text, &format!("{r}.t1"));
    let max = S::REDUCTION == Reduction::Max;
    // The exact term runs only in the exact step (kernels/exact.cu), whose distances must be the
    // CPU's bits where the terms allow it: its `log` is fdlibm's, as the CPU's (`exact_log`).
    let term = match src.exact_term {
        Some(([ex, ey, eprm], text)) => format!(
            "#define log exact_log\n\
             \x20   __device__ static double term(double {ex}, double {ey}, const Params& {eprm}) \
             {{ return {text}; }}\n\
             #undef log\n"
        ),
        None => {
            assert!(!max, "metric {}: a max reduction needs exact_term", S::NAME);
            String::new()
        }
    };
    // Whether `finish` is made of correctly rounded operations only (no pow, log or exp): the
    // device then finishes a reduced sum to the CPU's bits, and the kernels' keys of the pairs
    // sharing no column are their distances rather than bounds (see `disjoint` in knn.cu).
    let finish_exact = !["pow(", "log(", "log_positive(", "exp("]
        .iter()
        .any(|f| reads(&finish_text, f));
    // The filter by which the kernels skip finishing rows that cannot be selected (KeyForm).
    let filter = match S::KEY.cuda_filter() {
        Some((value, at_least)) => format!(
            "    static constexpr bool FILTER = true;\n\
             \x20   __device__ static double filter(double acc, double l_total, double l_norm, \
             double base) {{ return {value}; }}\n\
             \x20   __device__ static bool filter_at_least(double acc, double l_total, \
             double l_norm, double base, double F) {{ return {at_least}; }}\n"
        ),
        // Never called (FILTER is false); the kernels' code names them in both cases.
        None => "    static constexpr bool FILTER = false;\n\
                 \x20   __device__ static double filter(double, double, double, double) \
                 { return 0.0; }\n\
                 \x20   __device__ static bool filter_at_least(double, double, double, double, \
                 double) { return false; }\n"
            .to_string(),
    };
    format!(
        "// Metric `{name}`, generated from its definition in src/metric (not written by hand).\n\
         #define METRIC_REDUCTION_MAX {max}\n\
         struct MetricDef {{\n\
         \x20   static constexpr bool TWO = {two};\n\
         \x20   static constexpr bool SIMILARITY = {sim};\n\
         \x20   static constexpr bool NEEDS_RT0 = {needs_rt0};\n\
         \x20   static constexpr bool NEEDS_RT1 = {needs_rt1};\n\
         \x20   static constexpr double ROUNDING_GROWTH = {growth:?};\n\
         \x20   static constexpr bool FINISH_EXACT = {finish_exact};\n\
         {lift}\
         \x20   __device__ static double total0(double {tx}, const Params& {tprm}) {{ return {t0}; }}\n\
         \x20   __device__ static double total1(double {tx}, const Params& {tprm}) {{ return {t1}; }}\n\
         \x20   __device__ static double pair0(double {px}, double {py}, const Params& {pprm}) \
         {{ {plets}return {p0}; }}\n\
         \x20   __device__ static double pair1(double {px}, double {py}, const Params& {pprm}) \
         {{ {plets}return {p1}; }}\n\
         \x20   static constexpr bool LIFTED = {lifted};\n\
         \x20   __device__ static double pair0_lifted(double {px}, double {lx_name}, double {py}, \
         double {ly_name}, const Params& {pprm}) {{ {lifted_lets}return {p0}; }}\n\
         \x20   __device__ static double pair1_lifted(double {px}, double {lx_name}, double {py}, \
         double {ly_name}, const Params& {pprm}) {{ {lifted_lets}return {p1}; }}\n\
         \x20   __device__ static double finish(double {acc0}, double {acc1}, const Totals& {l}, \
         const Totals& {r}, const Params& {fprm}) {{ {flets}return {fin}; }}\n\
         {term}\
         {filter}\
         }};\n",
        name = S::NAME,
        max = max as u8,
        two = S::TWO_ACCUMULATORS,
        lifted = S::LIFTED,
        growth = S::ROUNDING_GROWTH,
        sim = S::SIMILARITY,
        t0 = src.total[0],
        t1 = src.total[1],
        p0 = src.pair[0],
        p1 = src.pair[1],
        fin = src.finish,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::{BrayCurtis, Chebyshev, Correlation, Cosine, Dot};

    #[test]
    fn right_totals_are_read_only_where_finish_uses_them() {
        assert!(cuda_definition::<Cosine>().contains("NEEDS_RT0 = true"));
        assert!(cuda_definition::<Dot>().contains("NEEDS_RT0 = false"));
        assert!(cuda_definition::<Correlation>().contains("NEEDS_RT1 = true"));
        assert!(cuda_definition::<Cosine>().contains("NEEDS_RT1 = false"));
    }

    #[test]
    fn the_generated_text_is_the_definition() {
        let bc = cuda_definition::<BrayCurtis>();
        assert!(bc.contains("TWO = true"), "{bc}");
        assert!(
            bc.contains("const double base = fabs(x) + fabs(y);"),
            "{bc}"
        );
        let cheb = cuda_definition::<Chebyshev>();
        assert!(cheb.contains("METRIC_REDUCTION_MAX 1"), "{cheb}");
        assert!(
            cheb.contains("static double term(double x, double y"),
            "{cheb}"
        );
        assert!(reads("a + r.t0", "r.t0") && !reads("for.t0", "r.t0"));
    }
}
