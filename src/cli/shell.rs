//! The interactive shell of `sparse-knn sql` on a terminal, in the manner of `psql` and
//! `datafusion-cli`: line editing and history (rustyline), statements that end at `;` over as
//! many lines as they take, backslash commands, and Ctrl-C that cancels the running statement
//! rather than the shell.
//!
//! The `datafusion-cli` crate (55.x) is published as a library too, but taking it would bring
//! the AWS SDK (`aws-config`), GCP and HTTP object stores, avro, compression codecs and
//! `mimalloc` into every build of this crate, for a loop of a few hundred lines; its REPL also
//! keeps history in `.history` of the working directory. So the loop is ours, on the same
//! editor crate.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::execution::context::SessionContext;
use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Config, Context, Editor, Helper};

use super::sql::{run_script, Format, Printer};
use super::{CliError, CliResult};

const PROMPT: &str = "sparse-knn> ";
/// Shown while a statement goes on over several lines, where the editor cannot hold them as one
/// input (a terminal it does not know how to drive).
const CONTINUATION_PROMPT: &str = "sparse-knn-> ";

const HELP: &str = "\
Statements end with ';' and may span lines. Ctrl-C cancels the running statement (or the input
being typed); Ctrl-D or \\q quits.

  \\d               list tables
  \\d NAME          describe table NAME
  \\df [PATTERN]    list sparse-knn's functions, or every function whose name contains PATTERN
  \\format [FMT]    show or set the output format: table, csv or json
  \\timing [on|off] show or set the row count and time printed after each query
  \\i FILE          run the statements of FILE
  \\?               this help
  \\q               quit

Settings: SET sparse_knn.device = 'cpu'; SHOW sparse_knn.device; SHOW ALL;
Tables: CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 'path/or/s3://bucket/key';
        or name a file directly: SELECT * FROM 'file.parquet';";

/// Where one lexical position of SQL text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    Code,
    SingleQuote,
    DoubleQuote,
    LineComment,
    /// Nesting depth (PostgreSQL and DataFusion's parser nest block comments).
    BlockComment(u32),
}

/// The outcome of scanning SQL text for statement ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Complete statements, each with its `;`, trimmed; statements that hold only comments or
    /// whitespace are dropped.
    pub statements: Vec<String>,
    /// Text after the last `;` that holds code or an open quote or comment: a statement not yet
    /// finished. Empty when there is none.
    pub rest: String,
}

/// Splits SQL text at the `;` that end statements: not those inside quotes ('...', "...") or
/// comments (`--` to the end of the line, nested `/* */`).
pub fn split_statements(text: &str) -> Split {
    scan(text).0
}

/// [`split_statements`], and where the end of `text` is.
fn scan(text: &str) -> (Split, Lex) {
    let mut statements = Vec::new();
    let mut lex = Lex::Code;
    let mut start = 0;
    let mut has_code = false;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, n)| n);
        match lex {
            Lex::Code => match c {
                '\'' => {
                    lex = Lex::SingleQuote;
                    has_code = true;
                }
                '"' => {
                    lex = Lex::DoubleQuote;
                    has_code = true;
                }
                '-' if next == Some('-') => {
                    chars.next();
                    lex = Lex::LineComment;
                }
                '/' if next == Some('*') => {
                    chars.next();
                    lex = Lex::BlockComment(1);
                }
                ';' => {
                    if has_code {
                        statements.push(text[start..=i].trim().to_string());
                    }
                    start = i + 1;
                    has_code = false;
                }
                c if !c.is_whitespace() => has_code = true,
                _ => {}
            },
            // A doubled quote ('' inside a string) closes and reopens: the same state after.
            Lex::SingleQuote if c == '\'' => lex = Lex::Code,
            Lex::DoubleQuote if c == '"' => lex = Lex::Code,
            Lex::LineComment if c == '\n' => lex = Lex::Code,
            Lex::BlockComment(depth) if c == '*' && next == Some('/') => {
                chars.next();
                lex = if depth == 1 {
                    Lex::Code
                } else {
                    Lex::BlockComment(depth - 1)
                };
            }
            Lex::BlockComment(depth) if c == '/' && next == Some('*') => {
                chars.next();
                lex = Lex::BlockComment(depth + 1);
            }
            _ => {}
        }
    }
    let open = matches!(
        lex,
        Lex::SingleQuote | Lex::DoubleQuote | Lex::BlockComment(_)
    );
    let rest = if has_code || open {
        text[start..].trim().to_string()
    } else {
        String::new()
    };
    (Split { statements, rest }, lex)
}

/// Whether the shell should act on `input` now (Enter runs it) or wait for more lines: a
/// backslash command or `quit` is complete at once, SQL once nothing follows its last `;`.
pub fn input_is_complete(input: &str) -> bool {
    let trimmed = input.trim();
    trimmed.is_empty()
        || trimmed.starts_with('\\')
        || is_quit(trimmed)
        || split_statements(input).rest.is_empty()
}

fn is_quit(trimmed: &str) -> bool {
    matches!(
        trimmed
            .trim_end_matches(';')
            .trim()
            .to_ascii_lowercase()
            .as_str(),
        "quit" | "exit"
    )
}

/// Whether the cursor at `pos` is inside a '...' string (where a file path is likely typed).
fn in_single_quote(line: &str, pos: usize) -> bool {
    line.get(..pos)
        .is_some_and(|before| scan(before).1 == Lex::SingleQuote)
}

/// The editor's helper: multi-line input until a statement ends, file names inside quotes.
#[derive(Default)]
struct ShellHelper {
    files: FilenameCompleter,
}

impl Validator for ShellHelper {
    fn validate(&self, ctx: &mut ValidationContext) -> rustyline::Result<ValidationResult> {
        Ok(if input_is_complete(ctx.input()) {
            ValidationResult::Valid(None)
        } else {
            ValidationResult::Incomplete
        })
    }
}

impl Completer for ShellHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        if in_single_quote(line, pos) {
            self.files.complete(line, pos, ctx)
        } else {
            Ok((pos, Vec::new()))
        }
    }
}

impl Hinter for ShellHelper {
    type Hint = String;
}

impl Highlighter for ShellHelper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        Cow::Borrowed(line)
    }
}

impl Helper for ShellHelper {}

/// The history file: `$SPARSE_KNN_HISTORY` (empty: no history), else `~/.sparse_knn_history`.
fn history_path() -> Option<PathBuf> {
    match std::env::var_os("SPARSE_KNN_HISTORY") {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| Path::new(&h).join(".sparse_knn_history")),
    }
}

/// Whether `path` may be used as the history file: absent, or a file this editor wrote (which
/// starts with rustyline's `#V2` line). Anything else there is left alone.
fn history_usable(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(m) if !m.is_file() => Err("not a regular file".into()),
        Ok(_) => {
            use std::io::Read;
            let mut head = [0u8; 4];
            let n = std::fs::File::open(path)
                .and_then(|mut f| f.read(&mut head))
                .map_err(|e| e.to_string())?;
            let ours = n == 0
                || (n >= 3 && &head[..3] == b"#V2" && (n == 3 || matches!(head[3], b'\n' | b'\r')));
            if ours {
                Ok(())
            } else {
                Err("not a sparse-knn history file".into())
            }
        }
    }
}

enum Flow {
    Continue,
    Quit,
}

/// Shell state that commands change.
struct Shell {
    ctx: SessionContext,
    format: Format,
    timing: bool,
}

/// Runs the interactive shell until `\q`, `quit` or end of input.
pub async fn run(ctx: SessionContext, format: Format) -> CliResult<()> {
    let config = Config::builder()
        .auto_add_history(false)
        .max_history_size(10_000)
        .map_err(readline_error)?
        .build();
    let mut editor: Editor<ShellHelper, DefaultHistory> =
        Editor::with_config(config).map_err(readline_error)?;
    editor.set_helper(Some(ShellHelper::default()));
    let history = history_path().and_then(|path| match history_usable(&path) {
        Ok(()) => Some(path),
        Err(why) => {
            eprintln!(
                "sparse-knn: not keeping history in {} ({why}); set SPARSE_KNN_HISTORY to another file",
                path.display()
            );
            None
        }
    });
    if let Some(path) = &history {
        if path.exists() {
            if let Err(e) = editor.load_history(path) {
                eprintln!("sparse-knn: cannot read history {}: {e}", path.display());
            }
        }
    }
    println!(
        "sparse-knn {} SQL shell. Statements end with ';'. \\? for help, \\q to quit.",
        env!("CARGO_PKG_VERSION")
    );
    let mut shell = Shell {
        ctx,
        format,
        timing: true,
    };
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            CONTINUATION_PROMPT
        };
        // The editor blocks on the terminal; the runtime's other threads carry on meanwhile.
        let line = tokio::task::block_in_place(|| editor.readline(prompt));
        match line {
            Ok(line) => {
                if !buffer.is_empty() {
                    buffer.push('\n');
                }
                buffer.push_str(&line);
                if !input_is_complete(&buffer) {
                    continue;
                }
                let input = std::mem::take(&mut buffer);
                if input.trim().is_empty() {
                    continue;
                }
                let _ = editor.add_history_entry(input.trim());
                if let Some(path) = &history {
                    // Appended after every input, so that a crash keeps it and two shells
                    // at once both add theirs.
                    if let Err(e) = editor.append_history(path) {
                        eprintln!("sparse-knn: cannot write history {}: {e}", path.display());
                    }
                }
                if let Flow::Quit = shell.handle(&input).await {
                    break;
                }
            }
            // Ctrl-C at the prompt drops what was typed, as in psql.
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(readline_error(e)),
        }
    }
    Ok(())
}

fn readline_error(e: ReadlineError) -> CliError {
    CliError(format!("terminal: {e}"))
}

impl Shell {
    async fn handle(&mut self, input: &str) -> Flow {
        let trimmed = input.trim();
        if let Some(command) = trimmed.strip_prefix('\\') {
            return self.command(command).await;
        }
        if is_quit(trimmed) {
            return Flow::Quit;
        }
        let split = split_statements(input);
        let mut statements = split.statements;
        if !split.rest.is_empty() {
            statements.push(split.rest);
        }
        for statement in statements {
            if !self.run_sql(statement).await {
                break;
            }
        }
        Flow::Continue
    }

    /// Runs one statement; Ctrl-C cancels it. Returns whether it succeeded.
    async fn run_sql(&self, sql: String) -> bool {
        let ctx = self.ctx.clone();
        let format = self.format;
        let started = Instant::now();
        let mut task = tokio::spawn(async move {
            let mut printer = Printer::new(format);
            run_script(&ctx, &sql, &mut printer).await
        });
        let finished = tokio::select! {
            joined = &mut task => Some(joined),
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(joined) = finished else {
            task.abort();
            // Aborting takes effect where the statement next yields; wait for that, briefly, so
            // that no late output lands after the prompt.
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
            eprintln!("cancelled");
            return false;
        };
        let result = joined.map_err(|e| CliError(format!("statement failed: {e}")));
        match result.and_then(|r| r) {
            Ok(rows) => {
                if self.timing {
                    if let Some(rows) = rows {
                        println!(
                            "{rows} row{} in set. Query took {:.3} seconds.\n",
                            if rows == 1 { "" } else { "s" },
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
                true
            }
            Err(e) => {
                eprintln!("Error: {e}");
                false
            }
        }
    }

    async fn command(&mut self, command: &str) -> Flow {
        let mut words = command.split_whitespace();
        let name = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        let arg = rest.join(" ");
        let arg = arg.trim_end_matches(';').trim();
        match name {
            "q" | "quit" => return Flow::Quit,
            "?" | "h" | "help" => println!("{HELP}"),
            "d" if arg.is_empty() => {
                self.run_sql(
                    "SELECT table_schema, table_name, table_type FROM information_schema.tables \
                     WHERE table_schema <> 'information_schema' ORDER BY table_schema, table_name"
                        .to_string(),
                )
                .await;
            }
            "d" => {
                let quoted = arg.replace('"', "\"\"");
                self.run_sql(format!("DESCRIBE \"{quoted}\"")).await;
            }
            "df" => self.list_functions(arg),
            "format" | "pset" => {
                let value = arg.strip_prefix("format").map(str::trim).unwrap_or(arg);
                match value.to_ascii_lowercase().as_str() {
                    "" => println!("format is {}", format_name(self.format)),
                    "table" => self.format = Format::Table,
                    "csv" => self.format = Format::Csv,
                    "json" => self.format = Format::Json,
                    other => eprintln!("Error: unknown format '{other}'; valid: table, csv, json"),
                }
            }
            "timing" => match arg.to_ascii_lowercase().as_str() {
                "" => {
                    self.timing = !self.timing;
                    println!("timing is {}", if self.timing { "on" } else { "off" });
                }
                "on" => self.timing = true,
                "off" => self.timing = false,
                other => eprintln!("Error: \\timing takes on or off, got '{other}'"),
            },
            "i" | "include" => {
                if arg.is_empty() {
                    eprintln!("Error: \\i needs a file name");
                } else {
                    match std::fs::read_to_string(arg) {
                        Ok(text) => {
                            for statement in split_statements(&text).statements {
                                if !self.run_sql(statement).await {
                                    break;
                                }
                            }
                        }
                        Err(e) => eprintln!("Error: cannot read {arg}: {e}"),
                    }
                }
            }
            other => eprintln!("Error: unknown command \\{other}; \\? lists the commands"),
        }
        Flow::Continue
    }

    fn list_functions(&self, pattern: &str) {
        let state = self.ctx.state();
        let mut rows: Vec<(String, &str)> = Vec::new();
        rows.extend(
            state
                .scalar_functions()
                .keys()
                .map(|n| (n.clone(), "scalar")),
        );
        rows.extend(
            state
                .aggregate_functions()
                .keys()
                .map(|n| (n.clone(), "aggregate")),
        );
        rows.extend(
            state
                .window_functions()
                .keys()
                .map(|n| (n.clone(), "window")),
        );
        rows.extend(state.table_functions().keys().map(|n| (n.clone(), "table")));
        if pattern.is_empty() {
            // The functions this crate adds: those a plain DataFusion session lacks.
            let plain = SessionContext::new().state();
            rows.retain(|(name, _)| {
                !plain.scalar_functions().contains_key(name)
                    && !plain.aggregate_functions().contains_key(name)
                    && !plain.window_functions().contains_key(name)
                    && !plain.table_functions().contains_key(name)
            });
        } else {
            let pattern = pattern.to_ascii_lowercase();
            rows.retain(|(name, _)| name.to_ascii_lowercase().contains(&pattern));
        }
        rows.sort();
        rows.dedup();
        let names: StringArray = rows.iter().map(|(n, _)| Some(n.as_str())).collect();
        let kinds: StringArray = rows.iter().map(|(_, k)| Some(*k)).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("function", DataType::Utf8, false),
            Field::new("kind", DataType::Utf8, false),
        ]));
        let printed = RecordBatch::try_new(schema.clone(), vec![Arc::new(names), Arc::new(kinds)])
            .map_err(CliError::from)
            .and_then(|batch| Printer::new(self.format).print_all(&schema, &[batch]));
        if let Err(e) = printed {
            eprintln!("Error: {e}");
        }
    }
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Table => "table",
        Format::Csv => "csv",
        Format::Json => "json",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statements(text: &str) -> Vec<String> {
        split_statements(text).statements
    }

    #[test]
    fn statements_end_at_semicolons_outside_quotes_and_comments() {
        assert_eq!(
            statements("SELECT 1; SELECT 2;"),
            ["SELECT 1;", "SELECT 2;"]
        );
        assert_eq!(
            statements("SELECT ';' AS a;\nSELECT \"x;y\" FROM t;"),
            ["SELECT ';' AS a;", "SELECT \"x;y\" FROM t;"]
        );
        assert_eq!(
            statements("SELECT 'it''s; fine';"),
            ["SELECT 'it''s; fine';"]
        );
        assert_eq!(
            statements("SELECT 1 -- a; comment\n+ 1;"),
            ["SELECT 1 -- a; comment\n+ 1;"]
        );
        assert_eq!(
            statements("SELECT /* a; /* nested; */ still; */ 2;"),
            ["SELECT /* a; /* nested; */ still; */ 2;"]
        );
        // Empty statements and comment-only ones are dropped.
        assert_eq!(statements(";; -- nothing;\n ; SELECT 3;"), ["SELECT 3;"]);
    }

    #[test]
    fn unfinished_statements_are_kept_as_the_rest() {
        let s = split_statements("SELECT 1; SELECT\n  2");
        assert_eq!(s.statements, ["SELECT 1;"]);
        assert_eq!(s.rest, "SELECT\n  2");
        assert_eq!(split_statements("SELECT 'open;").rest, "SELECT 'open;");
        assert_eq!(split_statements("/* open; ").rest, "/* open;");
        assert_eq!(split_statements("SELECT 1; -- trailing comment").rest, "");
        assert_eq!(split_statements("   \n").rest, "");
    }

    #[test]
    fn input_completes_at_a_statement_end_or_a_command() {
        assert!(!input_is_complete("SELECT 1"));
        assert!(!input_is_complete("SELECT 1\n+ 2"));
        assert!(input_is_complete("SELECT 1\n+ 2;"));
        assert!(input_is_complete("SELECT 1; -- done"));
        assert!(!input_is_complete("SELECT ';"));
        assert!(input_is_complete("SELECT ';';"));
        assert!(input_is_complete("\\d"));
        assert!(input_is_complete("  \\df sparse"));
        assert!(input_is_complete("quit"));
        assert!(input_is_complete("EXIT;"));
        assert!(input_is_complete(""));
    }

    #[test]
    fn file_names_complete_inside_quotes_only() {
        assert!(in_single_quote("SELECT * FROM 'data/ko", 22));
        assert!(!in_single_quote(
            "SELECT * FROM 'data/kos.parquet' WHERE",
            38
        ));
        assert!(!in_single_quote("SELECT * FR", 11));
    }

    #[test]
    fn history_file_is_only_one_this_shell_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("h");
        assert!(history_usable(&absent).is_ok());
        let ours = dir.path().join("ours");
        std::fs::write(&ours, "#V2\nSELECT 1;\n").unwrap();
        assert!(history_usable(&ours).is_ok());
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        assert!(history_usable(&empty).is_ok());
        let other = dir.path().join("notes.txt");
        std::fs::write(&other, "my notes\n").unwrap();
        assert!(history_usable(&other).is_err());
        assert!(history_usable(dir.path()).is_err());
    }
}
