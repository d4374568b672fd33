//! The endpoint: submissions answered by ticket, its own node's messages held until the writes
//! before them are durable, expired submissions reported, stray answers ignored.

use atomos_order::{
    Delivery, Endpoint, EndpointConfig, EndpointDelivery, EndpointRequest, OrderMsg, Outcome,
    Register, RegisterOp, Replica, ReplicaConfig, NO_DEADLINE,
};
use atomos_seam::{Input, Machine, Output};

type Out = Output<OrderMsg, EndpointDelivery>;

/// One replica alone, its endpoint, and a disk that confirms writes when told to.
struct Alone {
    endpoint: Endpoint<Register>,
    written: u64,
    now: u64,
}

impl Alone {
    fn new() -> Alone {
        Alone::with_lifetime(atomos_order::REQUEST_LIFETIME_MS)
    }

    /// Requests live at most `request_lifetime_ms` in the cluster.
    fn with_lifetime(request_lifetime_ms: u64) -> Alone {
        let replica = Replica::open(ReplicaConfig::new(1, vec![1]), Vec::new(), Register::new())
            .expect("a new replica opens");
        let cfg = EndpointConfig {
            client_base: 1 << 32,
            resend_ticks: 15,
            request_lifetime_ms,
        };
        Alone {
            endpoint: Endpoint::new(replica, &[1], cfg),
            written: 0,
            now: 1_000,
        }
    }

    /// Steps the endpoint; with `durable`, confirms every write at once afterwards.
    fn step(&mut self, input: Input<OrderMsg, EndpointRequest>, durable: bool) -> Vec<Out> {
        let mut out = Vec::new();
        self.endpoint
            .step(self.now, input, &mut out)
            .expect("the endpoint steps");
        self.written += out
            .iter()
            .filter(|o| matches!(o, Output::Persist(_)))
            .count() as u64;
        if durable {
            out.extend(self.confirm());
        }
        out
    }

    /// Every write so far is durable.
    fn confirm(&mut self) -> Vec<Out> {
        let through = self.written;
        let mut out = self.step(Input::Persisted { through }, false);
        // Confirming may make more writes (the replica acts on what it was waiting for).
        if self.written > through {
            out.extend(self.confirm());
        }
        out
    }

    fn elect(&mut self) {
        for _ in 0..100 {
            self.step(Input::Tick, true);
            if self.endpoint.replica().is_leader() {
                return;
            }
        }
        panic!("a replica alone never became leader");
    }

    /// Ticks (with a durable disk) until submission `ticket` is answered; its outcome.
    fn answer_of(&mut self, ticket: u64) -> Outcome {
        for _ in 0..100 {
            let mut out = self.step(Input::Request(EndpointRequest::Flush), true);
            out.extend(self.step(Input::Tick, true));
            if let Some(outcome) = answered(&out, ticket) {
                return outcome;
            }
        }
        panic!("submission {ticket} was never answered");
    }
}

fn answered(out: &[Out], ticket: u64) -> Option<Outcome> {
    out.iter().find_map(|o| match o {
        Output::Deliver(EndpointDelivery::Answered {
            ticket: t, outcome, ..
        }) if *t == ticket => Some(outcome.clone()),
        _ => None,
    })
}

fn submit(ticket: u64, op: &RegisterOp, deadline_ms: u64) -> Input<OrderMsg, EndpointRequest> {
    Input::Request(EndpointRequest::Submit {
        ticket,
        payload: postcard::to_stdvec(op).expect("an op encodes"),
        deadline_ms,
    })
}

#[test]
fn a_submission_is_answered_by_its_ticket_only_once_its_writes_are_durable() {
    let mut node = Alone::new();
    node.elect();
    let put = RegisterOp::Put {
        key: "k".into(),
        value: b"v".to_vec(),
    };
    // The disk confirms nothing: the batch is written, but nothing that depends on it happens.
    let mut out = node.step(submit(42, &put, NO_DEADLINE), false);
    for _ in 0..20 {
        out.extend(node.step(Input::Request(EndpointRequest::Flush), false));
        out.extend(node.step(Input::Tick, false));
    }
    assert!(node.written > 0, "the batch was written");
    assert_eq!(
        answered(&out, 42),
        None,
        "answered before its writes were durable"
    );
    assert_eq!(node.endpoint.in_flight(), 1);
    // Once durable, it is answered, once: the previous value, empty.
    out = node.confirm();
    let outcome = answered(&out, 42).unwrap_or_else(|| node.answer_of(42));
    assert_eq!(outcome, Outcome::Applied(Vec::new()));
    assert_eq!(node.endpoint.in_flight(), 0);
    let get = RegisterOp::Get { key: "k".into() };
    node.step(submit(43, &get, NO_DEADLINE), true);
    assert_eq!(node.answer_of(43), Outcome::Applied(b"v".to_vec()));
}

#[test]
fn a_submission_past_its_deadline_is_reported_expired() {
    let mut node = Alone::new();
    node.elect();
    let put = RegisterOp::Put {
        key: "late".into(),
        value: b"x".to_vec(),
    };
    // The log's time is the replica's clock (1,000 ms here): a deadline of 1 ms has passed.
    node.step(submit(7, &put, 1), true);
    assert_eq!(node.answer_of(7), Outcome::Expired);
    let get = RegisterOp::Get { key: "late".into() };
    node.step(submit(8, &get, NO_DEADLINE), true);
    assert_eq!(
        node.answer_of(8),
        Outcome::Applied(Vec::new()),
        "it never ran"
    );
}

#[test]
fn a_submission_that_outlives_a_requests_lifetime_is_sent_again_and_runs_once() {
    let mut node = Alone::with_lifetime(50);
    let append = RegisterOp::Append {
        key: "once".into(),
        value: b"x".to_vec(),
    };
    // Sent without a deadline before the replica leads: its request lives until 1,050, and
    // the clock runs past that before an election orders it, so it expires. It is sent again
    // as a new request (its client's next number), which runs; its submitter hears only that.
    let mut out = node.step(submit(5, &append, NO_DEADLINE), true);
    let mut outcome = None;
    for _ in 0..200 {
        node.now += 10;
        let mut more = node.step(Input::Tick, true);
        more.extend(node.step(Input::Request(EndpointRequest::Flush), true));
        outcome = outcome.or_else(|| answered(&more, 5));
        out.extend(more);
        if outcome.is_some() {
            break;
        }
    }
    // The new length of the bytes appended to: 1.
    assert_eq!(outcome, Some(Outcome::Applied(1u64.to_be_bytes().to_vec())));
    let ran: Vec<u64> = out
        .iter()
        .filter_map(|o| match o {
            Output::Deliver(EndpointDelivery::Order(Delivery::Opt { requests, .. })) => {
                Some(requests)
            }
            _ => None,
        })
        .flatten()
        .map(|r| r.seq)
        .collect();
    assert_eq!(ran, vec![2], "the first request expired, the second ran");
    let get = RegisterOp::Get { key: "once".into() };
    node.step(submit(6, &get, NO_DEADLINE), true);
    assert_eq!(
        node.answer_of(6),
        Outcome::Applied(b"x".to_vec()),
        "it ran once"
    );
}

#[test]
fn answers_nobody_waits_for_are_ignored() {
    let mut node = Alone::new();
    node.elect();
    let stray = OrderMsg::Reply {
        client: 99,
        seq: 1,
        response: b"?".to_vec(),
    };
    let out = node.step(
        Input::Message {
            from: 2,
            msg: stray,
        },
        true,
    );
    assert!(
        out.iter().all(|o| !matches!(o, Output::Deliver(_))),
        "{out:?}"
    );
}

#[test]
fn a_log_whose_time_runs_ahead_of_the_clock_still_orders_submissions_without_deadline() {
    let mut node = Alone::with_lifetime(50);
    node.now = 1_000_000;
    node.elect();
    let put = RegisterOp::Put {
        key: "k".into(),
        value: b"1".to_vec(),
    };
    node.step(submit(1, &put, NO_DEADLINE), true);
    assert_eq!(node.answer_of(1), Outcome::Applied(Vec::new()));
    // This node's clock is now far behind the log's time (another member's clock ran
    // ahead): a request capped from the clock alone would expire at once, again and again.
    node.now = 1_000;
    let get = RegisterOp::Get { key: "k".into() };
    node.step(submit(2, &get, NO_DEADLINE), true);
    assert_eq!(node.answer_of(2), Outcome::Applied(b"1".to_vec()));
}
