//! The Flight SQL service over one shared session: statements and prepared statements, with
//! `$1`-style or `?` parameters bound by the client (what ADBC drivers and the Flight SQL JDBC
//! driver send), planned against the session as it is,
//! checked (read-only unless allowed; reads confined to the roots), run with a bound on how
//! many run at once and an optional deadline, and streamed back as Arrow IPC.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::FlightSqlService;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTables, CommandPreparedStatementQuery, CommandStatementQuery,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::error::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionContext};
use datafusion::logical_expr::LogicalPlan;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status, Streaming};

use super::auth::peer;

type DoGetStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send>>;

/// What the service needs to know besides the session.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Statements that write or change the shared catalogue (COPY, INSERT, CREATE, DROP, SET).
    pub allow_writes: bool,
    /// Statements running at once; more wait for a slot.
    pub max_statements: usize,
    /// A statement still running after this is cancelled.
    pub statement_timeout: Option<Duration>,
}

/// Serves `ctx` to every client: one session, so one index cache, for all of them.
pub struct SqlEndpoint {
    ctx: SessionContext,
    limits: Limits,
    /// What GetSqlInfo answers (JDBC tools ask it for the server's name and version).
    sql_info: SqlInfoData,
    slots: Arc<Semaphore>,
    statements: AtomicU64,
    /// Plans made to answer GetFlightInfo, taken by the DoGet that follows (see `Planned`).
    planned: Mutex<VecDeque<Planned>>,
    plans_reused: AtomicU64,
    /// Statements with parameters, by text: planned and optimized once with their placeholders,
    /// each execution's values bound to that plan (see `bound_to_optimized`).
    optimized: Mutex<HashMap<String, LogicalPlan>>,
    statements_optimized: AtomicU64,
}

/// A plan ready to run: `optimized` when it is a kept optimized plan with values bound, which
/// goes straight to the physical planner (the logical optimizer already ran over it).
#[derive(Clone)]
struct Bound {
    plan: LogicalPlan,
    optimized: bool,
}

/// A statement planned for its schema (GetFlightInfo), kept for the DoGet of its ticket that a
/// client sends next: planning a one-row lookup twice cost a millisecond of CPU of each lookup a
/// server answers. Taken once; only where clients cannot change the catalogue in between
/// (read-only servers), and only for a few seconds.
struct Planned {
    handle: bytes::Bytes,
    at: Instant,
    plan: Bound,
}

/// Plans kept for their DoGet: a client that never fetches leaves one behind until it ages out or
/// newer ones push it out.
const MOST_PLANS_KEPT: usize = 256;
const PLAN_KEPT_FOR: Duration = Duration::from_secs(10);

/// Texts of statements with parameters whose optimized plans are kept (all are dropped when a
/// new one would pass this: clients prepare a few statements and run them many times).
const MOST_STATEMENTS_OPTIMIZED: usize = 256;

impl SqlEndpoint {
    pub fn new(ctx: SessionContext, limits: Limits) -> Self {
        let slots = Arc::new(Semaphore::new(limits.max_statements.max(1)));
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, "sparse-knn");
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        // The Arrow format version (Schema.fbs) the IPC stream is written in.
        info.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
        info.append(SqlInfo::FlightSqlServerReadOnly, !limits.allow_writes);
        let sql_info = info
            .build()
            .expect("a fixed set of server facts always encodes");
        Self {
            ctx,
            limits,
            sql_info,
            slots,
            statements: AtomicU64::new(0),
            planned: Mutex::new(VecDeque::new()),
            plans_reused: AtomicU64::new(0),
            optimized: Mutex::new(HashMap::new()),
            statements_optimized: AtomicU64::new(0),
        }
    }

    /// Statements whose DoGet ran the plan their GetFlightInfo made.
    pub fn plans_reused(&self) -> u64 {
        self.plans_reused.load(Ordering::Relaxed)
    }

    /// Executions of statements with parameters that took a kept optimized plan.
    pub fn statements_optimized(&self) -> u64 {
        self.statements_optimized.load(Ordering::Relaxed)
    }

    fn keep_plan(&self, statement: &Prepared, plan: &Bound) -> Result<(), Status> {
        if self.limits.allow_writes {
            return Ok(());
        }
        let handle = statement.handle()?;
        let now = Instant::now();
        let mut planned = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        while planned.front().is_some_and(|p| {
            now.duration_since(p.at) > PLAN_KEPT_FOR || planned.len() >= MOST_PLANS_KEPT
        }) {
            planned.pop_front();
        }
        planned.push_back(Planned {
            handle,
            at: now,
            plan: plan.clone(),
        });
        Ok(())
    }

    fn kept_plan(&self, statement: &Prepared) -> Option<Bound> {
        if self.limits.allow_writes {
            return None;
        }
        let handle = statement.handle().ok()?;
        let mut planned = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        let at = planned
            .iter()
            .rposition(|p| p.handle == handle && p.at.elapsed() <= PLAN_KEPT_FOR)?;
        let kept = planned.remove(at)?;
        self.plans_reused.fetch_add(1, Ordering::Relaxed);
        Some(kept.plan)
    }

    fn sql_options(&self) -> SQLOptions {
        let writes = self.limits.allow_writes;
        SQLOptions::new()
            .with_allow_ddl(writes)
            .with_allow_dml(writes)
            .with_allow_statements(writes)
    }

    /// `sql` planned against the session as it is now, refused if it would write while writes
    /// are not allowed. Planning reads nothing outside the roots (the planner checks paths).
    async fn plan(&self, sql: &str) -> Result<LogicalPlan, Status> {
        let sql = super::placeholders::numbered(sql)?;
        let plan = self
            .ctx
            .state()
            .create_logical_plan(&sql)
            .await
            .map_err(status_of)?;
        self.sql_options().verify_plan(&plan).map_err(|e| {
            Status::permission_denied(format!(
                "{}: this server is read-only (sparse-knn serve --allow-writes lets statements write or change its tables)",
                e.strip_backtrace()
            ))
        })?;
        Ok(plan)
    }

    /// A statement planned with the values bound to its parameters (`$1`, `$2`, ... in order of
    /// the parameter batch's columns); one with parameters and no values is the client's error.
    ///
    /// A read-only server keeps the optimized plan of each query text with parameters, made the
    /// first time the text comes, and binds each execution's values to it (no client can change
    /// the tables between two executions; the files a table reads are still listed when each
    /// execution is planned). The parse, analysis and optimization of a one-row lookup were a
    /// third of the CPU a served lookup took; a prepared statement pays them once.
    async fn plan_bound(&self, statement: &Prepared) -> Result<Bound, Status> {
        let keeps_optimized = !self.limits.allow_writes;
        if let (Some(values), true) = (&statement.parameters, keeps_optimized) {
            let kept = self
                .optimized
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&statement.sql)
                .cloned();
            if let Some(template) = kept {
                return self.bind_optimized(&template, values);
            }
        }
        let plan = self.plan(&statement.sql).await?;
        let parameters = parameters_of(&plan)?;
        let Some(values) = &statement.parameters else {
            if parameters.is_empty() {
                return Ok(Bound {
                    plan,
                    optimized: false,
                });
            }
            let names: Vec<_> = parameters.into_iter().map(|(name, _)| name).collect();
            return Err(Status::invalid_argument(format!(
                "the statement has parameters ({}): bind values to them (a prepared statement's \
                 parameters)",
                names.join(", ")
            )));
        };
        let is_query = !matches!(
            plan,
            LogicalPlan::Explain(_)
                | LogicalPlan::Analyze(_)
                | LogicalPlan::Ddl(_)
                | LogicalPlan::Dml(_)
                | LogicalPlan::Copy(_)
                | LogicalPlan::Statement(_)
                | LogicalPlan::DescribeTable(_)
        );
        if keeps_optimized && is_query && !parameters.is_empty() {
            let template = self.ctx.state().optimize(&plan).map_err(status_of)?;
            let mut optimized = self.optimized.lock().unwrap_or_else(|e| e.into_inner());
            if optimized.len() >= MOST_STATEMENTS_OPTIMIZED {
                optimized.clear();
            }
            optimized.insert(statement.sql.clone(), template.clone());
            drop(optimized);
            return self.bind_optimized(&template, values);
        }
        let plan = plan
            .with_param_values(scalar_values(values)?)
            .map_err(status_of)?;
        Ok(Bound {
            plan,
            optimized: false,
        })
    }

    /// `values` bound to a kept optimized plan, which then goes straight to the physical planner.
    fn bind_optimized(
        &self,
        template: &LogicalPlan,
        values: &RecordBatch,
    ) -> Result<Bound, Status> {
        let plan = template
            .clone()
            .with_param_values(scalar_values(values)?)
            .map_err(status_of)?;
        self.statements_optimized.fetch_add(1, Ordering::Relaxed);
        Ok(Bound {
            plan,
            optimized: true,
        })
    }

    async fn flight_info(
        &self,
        statement: &Prepared,
        ticket: &impl ProstMessageExt,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let plan = self.plan_bound(statement).await?;
        let schema = plan.plan.schema().as_arrow().clone();
        self.keep_plan(statement, &plan)?;
        info_of(&schema, ticket, descriptor)
    }

    /// The session's tables as Flight SQL's GetTables lists them (the builder applies the
    /// client's filters).
    async fn tables(&self, query: CommandGetTables) -> Result<RecordBatch, Status> {
        let mut builder = query.into_builder();
        for catalog_name in self.ctx.catalog_names() {
            let Some(catalog) = self.ctx.catalog(&catalog_name) else {
                continue;
            };
            for schema_name in catalog.schema_names() {
                let Some(schema) = catalog.schema(&schema_name) else {
                    continue;
                };
                for table_name in schema.table_names() {
                    let Ok(Some(table)) = schema.table(&table_name).await else {
                        continue;
                    };
                    let kind = match table.table_type() {
                        TableType::Base => "TABLE",
                        TableType::View => "VIEW",
                        TableType::Temporary => "LOCAL TEMPORARY",
                    };
                    builder
                        .append(
                            &catalog_name,
                            &schema_name,
                            &table_name,
                            kind,
                            &table.schema(),
                        )
                        .map_err(metadata_error)?;
                }
            }
        }
        builder.build().map_err(metadata_error)
    }

    /// Runs `sql` once a slot is free and streams its rows; the statement ends (and frees its
    /// memory) when its rows are sent, when it fails, when it passes the deadline, or when the
    /// client goes away (the stream is dropped).
    async fn run(
        &self,
        statement: &Prepared,
        peer: String,
    ) -> Result<Response<DoGetStream>, Status> {
        let sql = &statement.sql;
        let id = self.statements.fetch_add(1, Ordering::Relaxed) + 1;
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("the server is stopping"))?;
        let started = Instant::now();
        log::info!("serve: statement {id} from {peer}: {}", one_line(sql));
        let outcome = async {
            let bound = match self.kept_plan(statement) {
                Some(bound) => bound,
                None => self.plan_bound(statement).await?,
            };
            if bound.optimized {
                let state = self.ctx.state();
                let schema: SchemaRef = Arc::new(bound.plan.schema().as_arrow().clone());
                let physical = state
                    .query_planner()
                    .create_physical_plan(&bound.plan, &state)
                    .await
                    .map_err(status_of)?;
                let batches = datafusion::physical_plan::execute_stream(physical, state.task_ctx())
                    .map_err(status_of)?;
                return Ok::<_, Status>((schema, batches));
            }
            let df = self
                .ctx
                .execute_logical_plan(bound.plan)
                .await
                .map_err(status_of)?;
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            let batches = df.execute_stream().await.map_err(status_of)?;
            Ok::<_, Status>((schema, batches))
        }
        .await;
        let (schema, batches) = match outcome {
            Ok(ok) => ok,
            Err(status) => {
                log::info!(
                    "serve: statement {id} refused or failed: {}",
                    status.message()
                );
                return Err(status);
            }
        };
        let running = Running {
            id,
            started,
            rows: 0,
            ended: None,
            _slot: permit,
        };
        let timeout = self.limits.statement_timeout;
        let deadline = timeout.map(|t| tokio::time::Instant::from_std(started) + t);
        let rows = futures::stream::unfold(
            (batches, running),
            move |(mut batches, mut running)| async move {
                if running.ended.is_some() {
                    return None;
                }
                let next = match deadline {
                    Some(at) => tokio::time::timeout_at(at, batches.next()).await,
                    None => Ok(batches.next().await),
                };
                let failure = match next {
                    Ok(Some(Ok(batch))) => {
                        running.rows += batch.num_rows() as u64;
                        return Some((Ok(batch), (batches, running)));
                    }
                    Err(_elapsed) => {
                        running.ended = Some("cancelled at the statement timeout");
                        Status::deadline_exceeded(format!(
                            "the statement ran past the server's statement timeout ({:?}) and was cancelled",
                            timeout.unwrap_or_default()
                        ))
                    }
                    Ok(Some(Err(e))) => {
                        running.ended = Some("failed");
                        let status = status_of(e);
                        log::info!("serve: statement {}: {}", running.id, status.message());
                        status
                    }
                    Ok(None) => {
                        running.ended = Some("done");
                        drop((batches, running));
                        return None;
                    }
                };
                Some((
                    Err(FlightError::Tonic(Box::new(failure))),
                    (batches, running),
                ))
            },
        );
        let encoded = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(rows)
            .map_err(Status::from);
        Ok(Response::new(Box::pin(encoded)))
    }
}

/// A result of `schema`, fetched with a ticket that carries `ticket` (the command to answer).
fn info_of(
    schema: &arrow::datatypes::Schema,
    ticket: &impl ProstMessageExt,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec()));
    let info = FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(format!("encoding the result's schema: {e}")))?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor);
    Ok(Response::new(info))
}

/// One batch, already made, as a DoGet stream.
fn one_batch(batch: RecordBatch) -> Response<DoGetStream> {
    let schema = batch.schema();
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::iter([Ok(batch)]))
        .map_err(Status::from);
    Response::new(Box::pin(stream))
}

fn metadata_error(e: impl std::fmt::Display) -> Status {
    Status::internal(format!("building the catalogue's answer: {e}"))
}

/// A statement whose rows are being sent: holds its slot, and says how it ended when dropped.
struct Running {
    id: u64,
    started: Instant,
    rows: u64,
    ended: Option<&'static str>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        let how = self
            .ended
            .unwrap_or("cancelled: the client went away or cancelled");
        log::info!(
            "serve: statement {} {how} after {:.3} s, {} rows sent",
            self.id,
            self.started.elapsed().as_secs_f64(),
            self.rows
        );
    }
}

/// A statement on one line of a log, cut at 300 characters.
fn one_line(sql: &str) -> String {
    let line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

/// A DataFusion error as the client sees it: the message without the backtrace, coded by whose
/// fault it is.
fn status_of(error: DataFusionError) -> Status {
    let message = error.strip_backtrace();
    match error.find_root() {
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        DataFusionError::NotImplemented(_) => Status::unimplemented(message),
        DataFusionError::ObjectStore(e)
            if matches!(**e, object_store::Error::PermissionDenied { .. }) =>
        {
            Status::permission_denied(message)
        }
        DataFusionError::Plan(m) | DataFusionError::Execution(m) if m.contains("--allow-path") => {
            Status::permission_denied(message)
        }
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::Configuration(_) => Status::invalid_argument(message),
        _ => Status::unknown(message),
    }
}

fn statement_text(bytes: &[u8]) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec()).map_err(|_| foreign_handle())
}

fn foreign_handle() -> Status {
    Status::invalid_argument("the statement handle is not this server's")
}

/// A statement as its handle carries it: its text and, once a client bound them, the values of
/// its parameters (one row, a column each). Nothing is kept on the server between calls.
struct Prepared {
    sql: String,
    parameters: Option<RecordBatch>,
}

/// Starts a handle with bound parameters (SQL text never starts with a NUL byte).
const BOUND: &[u8] = b"\0sparse-knn bound\0";

impl Prepared {
    fn unbound(sql: String) -> Self {
        Self {
            sql,
            parameters: None,
        }
    }

    /// A handle: the text alone, or `BOUND`, the text's length (4 bytes, little-endian), the
    /// text and the values as an Arrow IPC stream.
    fn handle(&self) -> Result<bytes::Bytes, Status> {
        let Some(values) = &self.parameters else {
            return Ok(self.sql.clone().into_bytes().into());
        };
        let mut handle = BOUND.to_vec();
        handle.extend((self.sql.len() as u32).to_le_bytes());
        handle.extend(self.sql.as_bytes());
        let encoding = |e: arrow::error::ArrowError| {
            Status::internal(format!("encoding the parameters' values: {e}"))
        };
        let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut handle, &values.schema())
            .map_err(encoding)?;
        writer.write(values).map_err(encoding)?;
        writer.finish().map_err(encoding)?;
        drop(writer);
        Ok(handle.into())
    }

    fn from_handle(handle: &[u8]) -> Result<Self, Status> {
        let Some(rest) = handle.strip_prefix(BOUND) else {
            return Ok(Self::unbound(statement_text(handle)?));
        };
        let length = rest
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(foreign_handle)?;
        let sql = statement_text(rest.get(4..4 + length).ok_or_else(foreign_handle)?)?;
        let values = rest.get(4 + length..).ok_or_else(foreign_handle)?;
        let mut reader =
            arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(values), None)
                .map_err(|_| foreign_handle())?;
        let parameters = reader
            .next()
            .transpose()
            .map_err(|_| foreign_handle())?
            .ok_or_else(foreign_handle)?;
        Ok(Self {
            sql,
            parameters: Some(parameters),
        })
    }
}

/// A bound row of parameter values, a value a column in order.
fn scalar_values(values: &RecordBatch) -> Result<Vec<ScalarValue>, Status> {
    values
        .columns()
        .iter()
        .map(|column| ScalarValue::try_from_array(column, 0))
        .collect::<datafusion::error::Result<Vec<_>>>()
        .map_err(status_of)
}

/// A statement's parameters in order (`$1`, `$2`, ..., a named one after the numbered), typed
/// where the statement says how they are used.
fn parameters_of(
    plan: &LogicalPlan,
) -> Result<Vec<(String, Option<arrow::datatypes::DataType>)>, Status> {
    let mut parameters: Vec<_> = plan
        .get_parameter_types()
        .map_err(status_of)?
        .into_iter()
        .collect();
    parameters.sort_by_cached_key(|(name, _)| {
        let number = name.trim_start_matches('$').parse().unwrap_or(usize::MAX);
        (number, name.clone())
    });
    Ok(parameters)
}

#[tonic::async_trait]
impl FlightSqlService for SqlEndpoint {
    type FlightService = SqlEndpoint;

    /// Clients that shake hands first (some JDBC and ADBC set-ups) are admitted by the token
    /// they already sent with it; there is no other credential to trade.
    async fn do_handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: Default::default(),
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(reply)]))))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        // The ticket carries the statement itself: nothing is kept for a client that never
        // fetches its rows, and any of the server's connections can answer it.
        let ticket = TicketStatementQuery {
            statement_handle: query.query.clone().into_bytes().into(),
        };
        self.flight_info(
            &Prepared::unbound(query.query.clone()),
            &ticket,
            request.into_inner(),
        )
        .await
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let statement = Prepared::from_handle(&query.prepared_statement_handle)?;
        self.flight_info(&statement, &query, request.into_inner())
            .await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let sql = statement_text(&ticket.statement_handle)?;
        self.run(&Prepared::unbound(sql), peer(&request)).await
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let statement = Prepared::from_handle(&query.prepared_statement_handle)?;
        self.run(&statement, peer(&request)).await
    }

    /// A prepared statement is its text (and, once bound, its parameters' values, see
    /// `do_put_prepared_statement_query`): planned now to check it and give its schemas, planned
    /// again when run, against the session as it is then.
    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let plan = self.plan(&query.query).await?;
        let schema = plan.schema().as_arrow().clone();
        let parameters = arrow::datatypes::Schema::new(
            parameters_of(&plan)?
                .into_iter()
                .map(|(name, data_type)| {
                    arrow::datatypes::Field::new(
                        name,
                        data_type.unwrap_or(arrow::datatypes::DataType::Null),
                        true,
                    )
                })
                .collect::<Vec<_>>(),
        );
        let ipc = |schema: &arrow::datatypes::Schema| {
            SchemaAsIpc::new(schema, &IpcWriteOptions::default())
                .try_into()
                .map(|IpcMessage(bytes)| bytes)
                .map_err(|e: arrow::error::ArrowError| {
                    Status::internal(format!("encoding a schema: {e}"))
                })
        };
        let parameter_schema = if parameters.fields().is_empty() {
            Default::default()
        } else {
            ipc(&parameters)?
        };
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: Prepared::unbound(query.query).handle()?,
            dataset_schema: ipc(&schema)?,
            parameter_schema,
        })
    }

    /// A client binds values to a prepared statement's parameters: one row, a column per
    /// parameter in order. The answer is a new handle that carries them (checked by planning
    /// the statement with them now).
    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let statement = Prepared::from_handle(&query.prepared_statement_handle)?;
        let mut batches = FlightRecordBatchStream::new_from_flight_data(
            request
                .into_inner()
                .map_err(|status| FlightError::Tonic(Box::new(status))),
        );
        let mut values: Option<RecordBatch> = None;
        while let Some(batch) = batches
            .try_next()
            .await
            .map_err(|e| Status::invalid_argument(format!("reading the parameters' values: {e}")))?
        {
            if batch.num_rows() == 0 {
                continue;
            }
            if values.is_some() || batch.num_rows() != 1 {
                return Err(Status::invalid_argument(
                    "bind one row of parameter values at a time: this server runs a prepared \
                     statement for one set of values",
                ));
            }
            values = Some(batch);
        }
        let Some(values) = values else {
            return Err(Status::invalid_argument("no parameter values were sent"));
        };
        let bound = Prepared {
            sql: statement.sql,
            parameters: Some(values),
        };
        self.plan_bound(&bound).await?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(bound.handle()?),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        Ok(())
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        Err(Status::unimplemented(format!(
            "this server answers SQL statements and prepared statements, not {}",
            message.type_url
        )))
    }

    // The catalogue, for tools that browse it (DBeaver and other JDBC clients list tables with
    // these calls rather than with SQL).
    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        info_of(&schema, &query, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for name in self.ctx.catalog_names() {
            builder.append(name);
        }
        Ok(one_batch(builder.build().map_err(metadata_error)?))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        info_of(&schema, &query, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        for catalog_name in self.ctx.catalog_names() {
            if let Some(catalog) = self.ctx.catalog(&catalog_name) {
                for schema_name in catalog.schema_names() {
                    builder.append(&catalog_name, schema_name);
                }
            }
        }
        Ok(one_batch(builder.build().map_err(metadata_error)?))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        info_of(&schema, &query, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(self.tables(query).await?))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        info_of(&schema, &query, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let batch = query
            .into_builder(&self.sql_info)
            .build()
            .map_err(metadata_error)?;
        Ok(one_batch(batch))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn rows_of(response: Response<DoGetStream>) -> Vec<RecordBatch> {
        let data = response.into_inner().map_err(FlightError::from);
        FlightRecordBatchStream::new_from_flight_data(data)
            .try_collect()
            .await
            .unwrap()
    }

    async fn info_then_get(endpoint: &SqlEndpoint, sql: &str) -> Vec<RecordBatch> {
        let query = CommandStatementQuery {
            query: sql.to_string(),
            transaction_id: None,
        };
        let info = endpoint
            .get_flight_info_statement(
                query,
                Request::new(FlightDescriptor::new_cmd(sql.to_string())),
            )
            .await
            .unwrap()
            .into_inner();
        let ticket = info.endpoint[0].ticket.clone().unwrap();
        let ticket =
            TicketStatementQuery::decode(Any::decode(ticket.ticket.clone()).unwrap().value)
                .unwrap();
        rows_of(
            endpoint
                .do_get_statement(ticket, Request::new(Ticket::new(sql.to_string())))
                .await
                .unwrap(),
        )
        .await
    }

    fn limits(allow_writes: bool) -> Limits {
        Limits {
            allow_writes,
            max_statements: 2,
            statement_timeout: None,
        }
    }

    #[tokio::test]
    async fn a_ticket_runs_the_plan_its_flight_info_made_once() {
        let endpoint = SqlEndpoint::new(SessionContext::new(), limits(false));
        let sql = "SELECT v * 2 AS twice FROM (VALUES (1), (2), (3)) AS t(v)";
        let batches = info_then_get(&endpoint, sql).await;
        let twice = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        assert_eq!(
            twice.column(0).as_ref(),
            &arrow::array::Int64Array::from(vec![2, 4, 6]) as &dyn arrow::array::Array
        );
        assert_eq!(endpoint.plans_reused(), 1);
        // The same ticket again: its plan was taken, so it is planned anew (and answers alike).
        let again = rows_of(
            endpoint
                .do_get_statement(
                    TicketStatementQuery {
                        statement_handle: sql.as_bytes().to_vec().into(),
                    },
                    Request::new(Ticket::new(sql.to_string())),
                )
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(again, batches);
        assert_eq!(endpoint.plans_reused(), 1);
    }

    #[tokio::test]
    async fn a_server_that_allows_writes_plans_each_ticket_when_it_runs() {
        let endpoint = SqlEndpoint::new(SessionContext::new(), limits(true));
        let batches = info_then_get(&endpoint, "SELECT 7 AS x").await;
        assert_eq!(batches[0].num_rows(), 1);
        assert_eq!(endpoint.plans_reused(), 0);
    }

    /// A statement with parameters, bound and run the way clients run a prepared statement
    /// (DoPut of the values, GetFlightInfo, DoGet): its rows.
    async fn run_prepared(endpoint: &SqlEndpoint, sql: &str, value: i64) -> Vec<RecordBatch> {
        let values = RecordBatch::try_from_iter([(
            "$1",
            Arc::new(arrow::array::Int64Array::from(vec![value])) as arrow::array::ArrayRef,
        )])
        .unwrap();
        let bound = Prepared {
            sql: sql.to_string(),
            parameters: Some(values),
        };
        endpoint.plan_bound(&bound).await.unwrap();
        let query = CommandPreparedStatementQuery {
            prepared_statement_handle: bound.handle().unwrap(),
        };
        let info = endpoint
            .get_flight_info_prepared_statement(
                query.clone(),
                Request::new(FlightDescriptor::new_cmd(sql.to_string())),
            )
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.endpoint.len(), 1);
        rows_of(
            endpoint
                .do_get_prepared_statement(query, Request::new(Ticket::new(sql.to_string())))
                .await
                .unwrap(),
        )
        .await
    }

    fn int64s(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow::array::Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    /// A read-only server optimizes a statement with parameters once and binds each execution's
    /// values to that plan: the answers are those of the statement with the values written in.
    #[tokio::test]
    async fn a_prepared_statement_binds_each_execution_to_one_optimized_plan() {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t AS SELECT * FROM (VALUES (1, 10), (2, 20), (3, 30), (4, 40)) AS v(id, x)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let endpoint = SqlEndpoint::new(ctx.clone(), limits(false));
        let sql = "SELECT x FROM t WHERE id = $1 OR id > $1 + 2 ORDER BY x";
        for value in [1, 2, 4, 9] {
            let got = int64s(&run_prepared(&endpoint, sql, value).await);
            let written = sql.replace("$1", &value.to_string());
            let want = int64s(&ctx.sql(&written).await.unwrap().collect().await.unwrap());
            assert_eq!(got, want, "$1 = {value}");
        }
        // Each execution bound its values twice (DoPut's check, GetFlightInfo) to the one plan.
        assert_eq!(endpoint.statements_optimized(), 8);
        assert_eq!(endpoint.optimized.lock().unwrap().len(), 1);
        // A server that lets clients write plans each execution afresh.
        let writable = SqlEndpoint::new(ctx, limits(true));
        let got = int64s(&run_prepared(&writable, sql, 2).await);
        assert_eq!(got, vec![20]);
        assert_eq!(writable.statements_optimized(), 0);
    }

    #[test]
    fn long_statements_are_logged_on_one_cut_line() {
        assert_eq!(one_line("SELECT 1\n  FROM t"), "SELECT 1 FROM t");
        let long = "x ".repeat(400);
        assert!(one_line(&long).ends_with("..."));
        assert!(one_line(&long).len() < 310);
    }

    #[test]
    fn errors_are_coded_by_whose_fault_they_are() {
        let refused = status_of(DataFusionError::Plan(
            "knn_join: right: '/etc' is outside the folders this server reads (/data); its administrator can add a folder with --allow-path".into(),
        ));
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        let bad = status_of(DataFusionError::Plan("table 'x' not found".into()));
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        let big = status_of(DataFusionError::ResourcesExhausted("pool".into()));
        assert_eq!(big.code(), tonic::Code::ResourceExhausted);
    }
}
