//! The checks of a simulated run: the final order, a model that replays it, the list-append
//! history.

use super::*;
use crate::operator::scripted_end;

/// The final order as the replicas delivered it: entry seq -> its requests.
fn final_order(run: &Run<Note>) -> Result<BTreeMap<u64, Vec<Request>>, String> {
    #[derive(Default)]
    struct View {
        opt: BTreeMap<u64, Vec<Request>>,
        final_next: u64,
    }
    let mut order = Agreement::new("requests");
    let mut views: BTreeMap<NodeId, View> = BTreeMap::new();
    for (t, node, note) in &run.notes {
        let v = views.entry(*node).or_default();
        match note {
            Note::Started { base } => {
                *v = View {
                    opt: BTreeMap::new(),
                    final_next: base + 1,
                }
            }
            Note::Delivered(Delivery::Opt { seq, requests }) => {
                v.opt.insert(*seq, requests.clone());
            }
            Note::Delivered(Delivery::Revoke { from }) => {
                v.opt.split_off(from);
            }
            Note::Delivered(Delivery::Installed { seq }) => {
                v.opt.clear();
                v.final_next = seq + 1;
            }
            Note::Delivered(Delivery::Final { seq, .. }) => {
                let Some(requests) = v.opt.remove(seq) else {
                    return Err(format!("node {node} at {t}: final {seq} never optimistic"));
                };
                if *seq != v.final_next {
                    return Err(format!("node {node} at {t}: final {seq} out of order"));
                }
                v.final_next += 1;
                order.see(*node, *seq, requests).map_err(|e| {
                    if std::env::var("DEBUG_CERTIFY").is_ok() {
                        for l in &run.trace {
                            eprintln!("{l}");
                        }
                    }
                    format!("at {t}: {e}")
                })?;
            }
            _ => {}
        }
    }
    Ok(order.into_values())
}

/// The certification rule as a model: key -> (version, value bytes or deletion). Procedure
/// invocations run one at a time, in the final order, on an engine of the model's own that
/// gets every write, with no speculation.
struct Model {
    objects: BTreeMap<Key, (u64, Option<Vec<u8>>)>,
    position: u64,
    engine: Arc<Engine>,
    executor: SerialExecutor,
}

impl Model {
    fn new() -> Model {
        let engine = Arc::new(Engine::new(EngineConfig {
            replicated: true,
            ..EngineConfig::default()
        }));
        Model {
            objects: BTreeMap::new(),
            position: 0,
            executor: SerialExecutor::new(engine.clone(), bank_procedures()),
            engine,
        }
    }

    fn apply(&mut self, payload: &[u8]) -> Answer {
        self.position += 1;
        let position = self.position;
        match Entry::decode(payload) {
            Ok(Entry::Certify { reads, writes }) => {
                let current = reads
                    .iter()
                    .all(|(k, v)| self.objects.get(k).map_or(0, |o| o.0) == *v);
                if !current {
                    self.engine.mark_applied(position);
                    return Answer::Conflict { position };
                }
                for (k, bytes) in &writes {
                    self.objects.insert(k.clone(), (position, bytes.clone()));
                }
                self.engine.apply_certified(position, &[], writes);
                Answer::Committed { version: position }
            }
            Ok(Entry::Invoke {
                procedure,
                arguments,
            }) => {
                let invocation = Invocation {
                    procedure,
                    arguments,
                };
                let mut written = Vec::new();
                let outcome =
                    self.executor
                        .finalize((u64::MAX, 0), position, &invocation, |k, v| {
                            written.push((k.clone(), v.map(<[u8]>::to_vec)))
                        });
                for (k, bytes) in written {
                    self.objects.insert(k, (position, bytes));
                }
                Answer::Invoked { position, outcome }
            }
            Ok(Entry::Barrier) => Answer::Applied { position },
            Ok(Entry::Mark) => Answer::Marked { position, seq: 0 },
            // The model has no digest of its own: replicas compare theirs (an alarm fails the
            // run), and an answer is checked for its position only.
            Ok(Entry::ContentsDigest { .. }) => Answer::Digested {
                position,
                digest: 0,
            },
            Ok(other) => panic!("the simulation orders no {other:?}"),
            Err(e) => Answer::Refused {
                position,
                reason: e.to_string(),
            },
        }
    }

    fn snapshot(&self) -> Vec<atomos_core::SnapshotObject> {
        self.objects
            .iter()
            .map(|(k, (v, b))| (k.clone(), *v, b.clone()))
            .collect()
    }
}

/// Checks a run; returns how many certifications committed.
pub(crate) fn check(o: &Outcome) -> Result<usize, String> {
    if let Some((t, node, e)) = o.run.failures.first() {
        return Err(format!("replica {node} failed at {t}: {e}"));
    }
    if let Some((t, node, e)) = o.run.refused.first() {
        return Err(format!("replica {node} refused to start at {t}: {e}"));
    }
    let order = final_order(&o.run)?;
    if !order.keys().copied().eq(1..=order.len() as u64) {
        return Err("some positions were finally delivered by no replica".into());
    }
    // Replay the final order through the model.
    let mut model = Model::new();
    let mut expected = BTreeMap::new();
    let mut states = BTreeMap::new();
    let mut committed = 0;
    for requests in order.values() {
        for r in requests {
            let answer = model.apply(&r.payload);
            committed += matches!(
                answer,
                Answer::Committed { .. }
                    | Answer::Invoked {
                        outcome: atomos_core::Outcome::Returned(_),
                        ..
                    }
            ) as usize;
            expected.insert((r.client, r.seq), answer);
        }
        states.insert(model.position, model.snapshot());
    }
    let mut digests = Agreement::new("object digests");
    // Entry seq -> the membership in force from there on.
    let mut memberships = Agreement::new("memberships");
    for (t, node, note) in &o.run.notes {
        match note {
            Note::Answer {
                client,
                seq,
                response,
            } => {
                let mut got = Answer::decode(response).map_err(|e| e.to_string())?;
                if let Answer::Digested { digest, .. } = &mut got {
                    *digest = 0;
                }
                if expected.get(&(*client, *seq)) != Some(&got) {
                    return Err(format!(
                        "node {node} at {t}: answer {got:?} to {client}:{seq}, the final order \
                         says {:?}",
                        expected.get(&(*client, *seq))
                    ));
                }
            }
            Note::Digest { position, digest } => digests
                .see(*node, *position, *digest)
                .map_err(|e| format!("at {t}: {e}"))?,
            Note::Delivered(Delivery::Membership { seq, membership }) => memberships
                .see(*node, *seq, membership.clone())
                .map_err(|e| format!("at {t}: {e}"))?,
            Note::Delivered(Delivery::Alarm { seq, text }) => {
                return Err(format!("node {node} at {t}: alarm at entry {seq}: {text}"));
            }
            Note::Audit { total } if *total != INITIAL * ACCOUNTS as i64 => {
                return Err(format!("node {node} at {t}: an audit saw total {total}"));
            }
            _ => {}
        }
    }
    if o.unanswered > 0 {
        return Err(format!("{} requests never answered", o.unanswered));
    }
    check_lists(o)?;
    if committed < 10 {
        return Err(format!(
            "only {committed} commits: the run made no progress"
        ));
    }
    if o.membership_run && o.membership != scripted_end() {
        return Err(format!(
            "the run ended with the membership {:?}, not where the script leads",
            o.membership
        ));
    }
    let end = model.snapshot();
    for (node, final_next, position, objects) in &o.finals {
        if *final_next != order.len() as u64 + 1 || *position != model.position {
            return Err(format!(
                "replica {node} ended at entry {final_next} position {position}, the log has \
                 {} entries and {} positions",
                order.len(),
                model.position
            ));
        }
        if *objects != end {
            return Err(format!("replica {node}'s objects differ from the model's"));
        }
    }
    Ok(committed)
}

/// Checks the list-append history from every replica: transactions told they committed (with
/// what they read), those never answered as of unknown outcome, those refused left out.
/// Returns how many committed.
pub(crate) fn check_lists(o: &Outcome) -> Result<usize, String> {
    let aborted: BTreeSet<u64> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::ListAborted { id } => Some(*id),
            _ => None,
        })
        .collect();
    let runs = o.run.notes.iter().filter_map(|(_, _, n)| match n {
        Note::ListRun(t) => Some(t.clone()),
        _ => None,
    });
    let done = o.run.notes.iter().filter_map(|(_, node, n)| match n {
        Note::ListDone { id, ops } => Some((*node, *id, ops.clone())),
        _ => None,
    });
    check_list_run(runs, &aborted, done)
}
