//! Rules: comparisons of metric values against numbers, and of the list `decision` against
//! a list name, joined by `AND` / `OR` with parentheses (`AND` binds tighter), parsed by
//! recursive descent with columns in errors:
//!
//! ```text
//! or       := and ("OR" and)*
//! and      := primary ("AND" primary)*
//! primary  := "(" or ")" | metric op number | number op metric
//!           | "decision" eq choice | choice eq "decision"
//! op       := > | >= | < | <= | == | !=
//! eq       := == | !=
//! choice   := '"' list name '"' | "null"
//! ```
//!
//! A comparison with a metric that has no value (AVG, MIN or MAX over an empty window) is
//! false, whatever the operator: "no data" never triggers a rule.
//!
//! `decision` is what `POST /v1/evaluate` decided from its `precedence`: the first list of
//! that order with a hit, or `null` when none had one. `decision == "black"` holds when it is
//! `black`, `decision != "white"` when it is anything else (`null` included), `decision ==
//! null` when no list of the order had a hit. A request without `precedence` has no decision,
//! so every comparison of it is false, as with a metric that has no value. `decision` is told
//! from a metric of that name (a valid metric id) by what it is compared with: a number makes
//! it the metric.

use std::collections::BTreeSet;

use crate::domain::{ErrorCode, ListName, MetricId, ValidationError};

/// The decision a rule is evaluated with: `None` when the request gave no `precedence`,
/// `Some(None)` when no list of it had a hit, `Some(Some(list))` for the first that had one.
pub type Decision<'a> = Option<Option<&'a ListName>>;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl Op {
    fn apply(self, a: f64, b: f64) -> bool {
        match self {
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
        }
    }

    /// The operator with its operands swapped (`3 < x` is `x > 3`).
    fn flipped(self) -> Self {
        match self {
            Op::Gt => Op::Lt,
            Op::Ge => Op::Le,
            Op::Lt => Op::Gt,
            Op::Le => Op::Ge,
            other => other,
        }
    }
}

/// A parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// `metric op value`.
    Cmp(MetricId, Op, f64),
    /// `decision == "list"` (`equal`) or `!=`; `None`: `null`.
    Decision {
        equal: bool,
        list: Option<ListName>,
    },
    And(Vec<Rule>),
    Or(Vec<Rule>),
}

impl Rule {
    /// The metrics it reads.
    pub fn metrics(&self) -> BTreeSet<MetricId> {
        let mut out = BTreeSet::new();
        self.collect(&mut out);
        out
    }

    fn collect(&self, out: &mut BTreeSet<MetricId>) {
        match self {
            Rule::Cmp(m, _, _) => {
                out.insert(m.clone());
            }
            Rule::Decision { .. } => {}
            Rule::And(v) | Rule::Or(v) => v.iter().for_each(|r| r.collect(out)),
        }
    }

    /// Evaluates with `value(metric)` and no decision; `None` (no value) makes a comparison
    /// false.
    pub fn eval(&self, value: &impl Fn(&MetricId) -> Option<f64>) -> bool {
        self.eval_with(value, None)
    }

    /// Evaluates with `value(metric)` and the request's `decision`: a metric with no value,
    /// or a decision the request did not ask for, makes its comparison false.
    pub fn eval_with(
        &self,
        value: &impl Fn(&MetricId) -> Option<f64>,
        decision: Decision<'_>,
    ) -> bool {
        match self {
            Rule::Cmp(m, op, v) => value(m).is_some_and(|x| op.apply(x, *v)),
            Rule::Decision { equal, list } => {
                decision.is_some_and(|d| (d == list.as_ref()) == *equal)
            }
            Rule::And(v) => v.iter().all(|r| r.eval_with(value, decision)),
            Rule::Or(v) => v.iter().any(|r| r.eval_with(value, decision)),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Num(f64),
    /// A double-quoted string (no escapes: it names a list).
    Str(String),
    Op(Op),
    Open,
    Close,
    End,
}

fn err(col: usize, msg: impl Into<String>) -> ValidationError {
    ValidationError::at_column(ErrorCode::InvalidRule, col, msg)
}

/// `what` was expected at `col`, and `found` stands there.
fn expected(col: usize, what: &str, found: &Tok) -> ValidationError {
    err(col, format!("expected {what}, found {}", describe(found)))
}

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, ValidationError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        if c.is_whitespace() {
            i += 1;
        } else if c == '(' {
            out.push((Tok::Open, col));
            i += 1;
        } else if c == ')' {
            out.push((Tok::Close, col));
            i += 1;
        } else if let Some(op) = match two.as_str() {
            ">=" => Some(Op::Ge),
            "<=" => Some(Op::Le),
            "==" => Some(Op::Eq),
            "!=" => Some(Op::Ne),
            _ => None,
        } {
            out.push((Tok::Op(op), col));
            i += 2;
        } else if c == '>' || c == '<' {
            out.push((Tok::Op(if c == '>' { Op::Gt } else { Op::Lt }), col));
            i += 1;
        } else if c.is_ascii_digit() || c == '-' || c == '.' {
            let start = i;
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_digit()
                    || matches!(chars[i], '.' | 'e' | 'E')
                    || (matches!(chars[i], '+' | '-') && matches!(chars[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let n: f64 = text
                .parse()
                .ok()
                .filter(|n: &f64| n.is_finite())
                .ok_or_else(|| err(col, format!("{text:?} is not a number")))?;
            out.push((Tok::Num(n), col));
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Word(chars[start..i].iter().collect()), col));
        } else if c == '"' {
            let start = i + 1;
            let Some(len) = chars[start..].iter().position(|&c| c == '"') else {
                return Err(err(col, "a string without its closing \""));
            };
            out.push((Tok::Str(chars[start..start + len].iter().collect()), col));
            i = start + len + 1;
        } else if c == '=' {
            return Err(err(col, "use == to compare"));
        } else {
            return Err(err(col, format!("unexpected character {c:?}")));
        }
    }
    out.push((Tok::End, chars.len() + 1));
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    depth: usize,
}

/// Deepest nesting of parentheses (the parser recurses once per level).
pub const MAX_DEPTH: usize = 32;
/// Longest rule, in bytes.
pub const MAX_RULE_LEN: usize = 4096;

fn describe(t: &Tok) -> String {
    match t {
        Tok::Word(w) => format!("{w:?}"),
        Tok::Num(n) => format!("the number {n}"),
        Tok::Str(_) => "a string".into(),
        Tok::Op(_) => "an operator".into(),
        Tok::Open => "'('".into(),
        Tok::Close => "')'".into(),
        Tok::End => "the end of the rule".into(),
    }
}

fn is_kw(t: &Tok, kw: &str) -> bool {
    matches!(t, Tok::Word(w) if w.eq_ignore_ascii_case(kw))
}

impl Parser {
    fn next(&mut self) -> (Tok, usize) {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn or(&mut self) -> Result<Rule, ValidationError> {
        self.joined("or", Self::and, Rule::Or)
    }

    fn and(&mut self) -> Result<Rule, ValidationError> {
        self.joined("and", Self::primary, Rule::And)
    }

    /// One or more `term`s joined by the keyword `kw`: a lone term as itself, more as `join`.
    fn joined(
        &mut self,
        kw: &str,
        term: fn(&mut Self) -> Result<Rule, ValidationError>,
        join: fn(Vec<Rule>) -> Rule,
    ) -> Result<Rule, ValidationError> {
        let mut terms = vec![term(self)?];
        while is_kw(&self.toks[self.pos].0, kw) {
            self.next();
            terms.push(term(self)?);
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            join(terms)
        })
    }

    fn primary(&mut self) -> Result<Rule, ValidationError> {
        match self.next() {
            (Tok::Open, col) => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(err(
                        col,
                        format!("parentheses nested deeper than {MAX_DEPTH}"),
                    ));
                }
                let inner = self.or()?;
                self.depth -= 1;
                match self.next() {
                    (Tok::Close, _) => Ok(inner),
                    (t, col) => Err(expected(col, "')'", &t)),
                }
            }
            (Tok::Word(w), col) => {
                // A name that can only be a metric is checked as one before what follows,
                // so its error points at it.
                if w != DECISION && !w.eq_ignore_ascii_case("null") {
                    metric(w.clone(), col)?;
                }
                let op = self.op()?;
                match self.next() {
                    (Tok::Num(n), _) => Ok(Rule::Cmp(metric(w, col)?, op, n)),
                    (t, at) if w == DECISION => decision(op, col, t, at),
                    (Tok::Word(d), _) if d == DECISION => decision(op, col, Tok::Word(w), col),
                    (t, col) => Err(expected(col, "a number", &t)),
                }
            }
            (Tok::Num(n), _) => {
                let op = self.op()?;
                match self.next() {
                    (Tok::Word(w), col) => Ok(Rule::Cmp(metric(w, col)?, op.flipped(), n)),
                    (t, col) => Err(expected(col, "a metric id", &t)),
                }
            }
            (Tok::Str(s), col) => {
                let op = self.op()?;
                match self.next() {
                    (Tok::Word(w), _) if w == DECISION => decision(op, col, Tok::Str(s), col),
                    (t, col) => Err(expected(col, "decision", &t)),
                }
            }
            (t, col) => Err(expected(col, "a comparison or '('", &t)),
        }
    }

    fn op(&mut self) -> Result<Op, ValidationError> {
        match self.next() {
            (Tok::Op(op), _) => Ok(op),
            (t, col) => Err(expected(col, "> >= < <= == or !=", &t)),
        }
    }
}

/// The name that compares with a list name rather than a number.
const DECISION: &str = "decision";

/// `decision op choice` (either way round): `choice` must be a quoted list name or `null`,
/// `op` `==` or `!=`.
fn decision(op: Op, col: usize, choice: Tok, at: usize) -> Result<Rule, ValidationError> {
    let equal = match op {
        Op::Eq => true,
        Op::Ne => false,
        _ => return Err(err(col, "decision compares only with == or !=")),
    };
    let list = match choice {
        Tok::Word(w) if w.eq_ignore_ascii_case("null") => None,
        Tok::Str(s) => Some(ListName::try_from(s).map_err(|e| err(at, e.message))?),
        t => {
            return Err(expected(
                at,
                "a list name in quotes (\"black\") or null",
                &t,
            ));
        }
    };
    Ok(Rule::Decision { equal, list })
}

fn metric(w: String, col: usize) -> Result<MetricId, ValidationError> {
    if w.eq_ignore_ascii_case("and") || w.eq_ignore_ascii_case("or") {
        return Err(err(col, format!("expected a comparison, found {w}")));
    }
    MetricId::try_from(w).map_err(|e| err(col, e.message))
}

/// Parses a rule expression.
pub fn parse(src: &str) -> Result<Rule, ValidationError> {
    ValidationError::check_len(src, MAX_RULE_LEN, ErrorCode::InvalidRule, "a rule")?;
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
        depth: 0,
    };
    let rule = p.or()?;
    match p.next() {
        (Tok::End, _) => Ok(rule),
        (t, col) => Err(err(
            col,
            format!(
                "unexpected {} (join comparisons with AND / OR)",
                describe(&t)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn eval(src: &str, values: &[(&str, Option<f64>)]) -> bool {
        let map: HashMap<String, Option<f64>> =
            values.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        parse(src)
            .unwrap()
            .eval(&|m: &MetricId| map.get(m.as_str()).copied().flatten())
    }

    #[test]
    fn precedence_parentheses_and_flips() {
        let v = [("a", Some(5.0)), ("b", Some(0.0)), ("c", Some(1000.0))];
        assert!(eval("a > 3 AND c >= 1000", &v));
        assert!(!eval("a > 3 AND b > 0", &v));
        assert!(
            eval("b > 0 OR a > 3 AND c >= 1000", &v),
            "AND binds tighter"
        );
        assert!(!eval("(b > 0 OR a > 3) AND c > 1000", &v));
        assert!(eval("3 < a and 4.5 <= a", &v), "number op metric, any case");
        assert!(eval("a == 5 and b != 1 and c <= 1e3 and b >= -0.5", &v));
        assert_eq!(
            parse("(x > 1 or y < 2) and z == 3")
                .unwrap()
                .metrics()
                .iter()
                .map(MetricId::as_str)
                .collect::<Vec<_>>(),
            ["x", "y", "z"]
        );
    }

    #[test]
    fn no_value_is_false() {
        let v = [("avg", None)];
        assert!(!eval("avg > 1", &v));
        assert!(!eval("avg != 1", &v));
        assert!(eval("avg == 0 AND avg != 2", &[("avg", Some(0.0))]));
        assert!(eval(
            "avg > 1 OR x >= 0",
            &[("avg", None), ("x", Some(0.0))]
        ));
    }

    fn decide(src: &str, decision: Decision<'_>) -> bool {
        parse(src).unwrap().eval_with(&|_| Some(5.0), decision)
    }

    #[test]
    fn decision_comparisons() {
        let black: ListName = "black".parse().unwrap();
        let white: ListName = "white".parse().unwrap();
        let cases: &[(&str, [bool; 4])] = &[
            // (rule, [no precedence, null, black, white])
            (r#"decision == "black""#, [false, false, true, false]),
            (r#""black" == decision"#, [false, false, true, false]),
            (r#"decision != "black""#, [false, true, false, true]),
            ("decision == null", [false, true, false, false]),
            ("null != decision", [false, false, true, true]),
            ("decision == NULL", [false, true, false, false]),
            (
                r#"decision == "white" OR decision == "black" AND m > 3"#,
                [false, false, true, true],
            ),
            (
                r#"decision != "white" AND m > 6"#,
                [false, false, false, false],
            ),
        ];
        for (src, want) in cases {
            let got = [
                decide(src, None),
                decide(src, Some(None)),
                decide(src, Some(Some(&black))),
                decide(src, Some(Some(&white))),
            ];
            assert_eq!(&got, want, "{src}");
        }
        let rule = parse(r#"decision == "grey" and m > 1"#).unwrap();
        assert_eq!(
            rule.metrics()
                .iter()
                .map(MetricId::as_str)
                .collect::<Vec<_>>(),
            ["m"],
            "decision is not a metric"
        );
        // A metric may still be called decision: a number makes it the metric.
        let metric = parse("decision > 3").unwrap();
        assert_eq!(
            metric
                .metrics()
                .iter()
                .map(MetricId::as_str)
                .collect::<Vec<_>>(),
            ["decision"]
        );
        assert!(!eval("decision > 3", &[("decision", Some(1.0))]));
        assert!(eval("3 < decision", &[("decision", Some(4.0))]));
    }

    #[test]
    fn errors_point_at_the_column() {
        for (src, col, what) in [
            ("a >", 4, "expected a number"),
            ("a 3", 3, "expected >"),
            ("a = 3", 3, "=="),
            ("a > 3 b > 2", 7, "AND / OR"),
            ("(a > 3", 7, "expected ')'"),
            ("a > 3 AND", 10, "comparison"),
            ("A > 3", 1, "metric id"),
            ("a > x", 5, "expected a number"),
            ("a > 1..2", 5, "not a number"),
            ("a > 3 # b", 7, "unexpected character"),
            (r#"decision > "black""#, 1, "only with == or !="),
            (r#"decision == "Black""#, 13, "list"),
            (r#"decision == "black"#, 13, "closing"),
            ("decision == black", 13, "list name in quotes"),
            ("decision == 3 and", 18, "comparison"),
            (r#"m == "black""#, 6, "expected a number"),
            (r#""black" == m"#, 12, "expected decision"),
            (
                &format!("{}a > 1{}", "(".repeat(33), ")".repeat(33)),
                33,
                "nested deeper",
            ),
        ] {
            super::super::assert_points_at(parse(src), "invalid_rule", src, col, what);
        }
    }
}
