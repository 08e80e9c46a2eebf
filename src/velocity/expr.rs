//! The metric expression grammar of API.md, parsed by a small recursive-descent parser over a
//! tokenizer that keeps columns, so every error says where it is:
//!
//! ```text
//! expr     := FUNC "(" duration "," name ("," name)* ")" [ BY name ("," name)* ]
//! FUNC     := COUNT | SUM | AVG | MIN | MAX | COUNT_DISTINCT | APPROX_COUNT_DISTINCT   (any case)
//! duration := digits ("s" | "m" | "h" | "d")
//! name     := [A-Za-z0-9_.-]+                                                       (an event type or field)
//! ```
//!
//! With `BY`, the arguments are exactly `(window, event)` for COUNT and `(window, event,
//! field)` for the others. Without it, the seeds' positional forms apply:
//!
//! | form | meaning |
//! |---|---|
//! | `COUNT(7d, transaction, device_id)` | `COUNT(7d, transaction) BY device_id` |
//! | `SUM(1d, transaction, amount, userid)` | `SUM(1d, transaction, amount) BY userid` (same for AVG/MIN/MAX) |
//! | `COUNT_DISTINCT(30d, login, device_id, userid)` | `COUNT_DISTINCT(30d, login, userid) BY device_id` (the counted field comes last) |

use crate::domain::{ErrorCode, EventType, FieldName, ValidationError};

/// What a metric aggregates.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    Count,
    Sum,
    Avg,
    Min,
    Max,
    CountDistinct,
    ApproxCountDistinct,
}

impl Aggregation {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "COUNT" => Aggregation::Count,
            "SUM" => Aggregation::Sum,
            "AVG" => Aggregation::Avg,
            "MIN" => Aggregation::Min,
            "MAX" => Aggregation::Max,
            "COUNT_DISTINCT" => Aggregation::CountDistinct,
            "APPROX_COUNT_DISTINCT" => Aggregation::ApproxCountDistinct,
            _ => return None,
        })
    }

    /// Whether it measures a field (all but COUNT).
    pub fn has_field(self) -> bool {
        self != Aggregation::Count
    }

    /// Whether the field must be a number (SUM, AVG, MIN, MAX).
    pub fn numeric(self) -> bool {
        matches!(
            self,
            Aggregation::Sum | Aggregation::Avg | Aggregation::Min | Aggregation::Max
        )
    }
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub aggregation: Aggregation,
    pub window_ms: i64,
    pub event: EventType,
    pub field: Option<FieldName>,
    pub group_by: Vec<FieldName>,
}

/// Parses a duration `<n>s|m|h|d` into milliseconds.
pub fn parse_duration(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.len().saturating_sub(1));
    let unit_ms: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?} is not a duration like 30s, 10m, 1h or 7d")),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a duration like 30s, 10m, 1h or 7d"));
    }
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is too long a duration"))?;
    if n == 0 {
        return Err("a duration must be positive".into());
    }
    n.checked_mul(unit_ms)
        .ok_or_else(|| format!("{s:?} is too long a duration"))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Comma,
    Open,
    Close,
    End,
}

struct Lexer {
    toks: Vec<(Tok, usize)>,
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-'
}

impl Lexer {
    fn run(src: &str) -> Result<Vec<(Tok, usize)>, ValidationError> {
        let mut lx = Lexer { toks: Vec::new() };
        // Columns count characters, kept as we go (not recounted from the start).
        let mut chars = src.chars().peekable();
        let mut col = 1;
        while let Some(&c) = chars.peek() {
            match c {
                c if c.is_whitespace() => {
                    chars.next();
                    col += 1;
                }
                ',' | '(' | ')' => {
                    let punct = match c {
                        ',' => Tok::Comma,
                        '(' => Tok::Open,
                        _ => Tok::Close,
                    };
                    lx.toks.push((punct, col));
                    chars.next();
                    col += 1;
                }
                c if is_word(c) => {
                    let start = col;
                    let mut w = String::new();
                    while let Some(&c) = chars.peek() {
                        if !is_word(c) {
                            break;
                        }
                        w.push(c);
                        chars.next();
                        col += 1;
                    }
                    lx.toks.push((Tok::Word(w), start));
                }
                other => return Err(err(col, format!("unexpected character {other:?}"))),
            }
        }
        lx.toks.push((Tok::End, col));
        Ok(lx.toks)
    }
}

fn err(col: usize, msg: impl Into<String>) -> ValidationError {
    ValidationError::at_column(ErrorCode::InvalidExpr, col, msg)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &(Tok, usize) {
        &self.toks[self.pos]
    }

    fn next(&mut self) -> (Tok, usize) {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn expect(&mut self, want: Tok, what: &str) -> Result<usize, ValidationError> {
        let (t, col) = self.next();
        if t == want {
            Ok(col)
        } else {
            Err(err(col, format!("expected {what}, found {}", describe(&t))))
        }
    }

    fn word(&mut self, what: &str) -> Result<(String, usize), ValidationError> {
        match self.next() {
            (Tok::Word(w), col) => Ok((w, col)),
            (t, col) => Err(err(col, format!("expected {what}, found {}", describe(&t)))),
        }
    }
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Word(w) => format!("{w:?}"),
        Tok::Comma => "','".into(),
        Tok::Open => "'('".into(),
        Tok::Close => "')'".into(),
        Tok::End => "the end of the expression".into(),
    }
}

fn field_name(name: String, col: usize) -> Result<FieldName, ValidationError> {
    FieldName::try_from(name).map_err(|e| err(col, e.message))
}

/// A word and the column it starts at.
type Spanned = (String, usize);

/// Longest expression, in bytes.
pub const MAX_EXPR_LEN: usize = 1024;
/// Most group-by fields.
pub const MAX_GROUP_BY: usize = 8;

/// Parses a metric expression.
pub fn parse(src: &str) -> Result<Parsed, ValidationError> {
    ValidationError::check_len(src, MAX_EXPR_LEN, ErrorCode::InvalidExpr, "an expression")?;
    let mut p = Parser {
        toks: Lexer::run(src)?,
        pos: 0,
    };
    let (func, col) = p.word("an aggregation such as COUNT or SUM")?;
    let aggregation = Aggregation::from_name(&func).ok_or_else(|| {
        err(
            col,
            format!(
                "unknown aggregation {func:?}: expected COUNT, SUM, AVG, MIN, MAX, COUNT_DISTINCT or APPROX_COUNT_DISTINCT"
            ),
        )
    })?;
    p.expect(Tok::Open, "'('")?;
    let (window, wcol) = p.word("a window such as 7d")?;
    let window_ms = parse_duration(&window).map_err(|m| err(wcol, m))?;
    p.expect(Tok::Comma, "',' after the window")?;
    let (event, ecol) = p.word("an event type")?;
    let event = EventType::try_from(event).map_err(|e| err(ecol, e.message))?;
    let mut args: Vec<Spanned> = Vec::new();
    loop {
        match p.next() {
            (Tok::Close, _) => break,
            (Tok::Comma, _) => args.push(p.word("a field name")?),
            (t, col) => {
                return Err(err(
                    col,
                    format!("expected ',' or ')', found {}", describe(&t)),
                ));
            }
        }
    }
    let mut by: Vec<Spanned> = Vec::new();
    if let (Tok::Word(w), col) = p.peek().clone() {
        if !w.eq_ignore_ascii_case("by") {
            return Err(err(col, format!("expected BY or the end, found {w:?}")));
        }
        p.next();
        by.push(p.word("a field name after BY")?);
        while p.peek().0 == Tok::Comma {
            p.next();
            by.push(p.word("a field name")?);
        }
    }
    let (end, col) = p.next();
    if end != Tok::End {
        return Err(err(
            col,
            format!("unexpected {} after the expression", describe(&end)),
        ));
    }

    let close_col = p
        .toks
        .iter()
        .rev()
        .find(|(t, _)| *t == Tok::Close)
        .map_or(1, |(_, c)| *c);
    let (field_arg, group): (Option<Spanned>, Vec<Spanned>) = if !by.is_empty() {
        let want = usize::from(aggregation.has_field());
        if args.len() != want {
            let col = args.get(want).map_or(close_col, |a| a.1);
            return Err(err(
                col,
                if want == 0 {
                    "COUNT(window, event) BY ... takes no field: group-by fields go after BY"
                        .to_owned()
                } else {
                    format!("{func}(window, event, field) BY ... takes exactly one field")
                },
            ));
        }
        (args.into_iter().next(), by)
    } else {
        match aggregation {
            Aggregation::Count => (None, args),
            Aggregation::Sum | Aggregation::Avg | Aggregation::Min | Aggregation::Max => {
                if args.len() < 2 {
                    return Err(err(
                        close_col,
                        format!(
                            "{func} needs a field and at least one group-by field: {func}(window, event, field) BY dim"
                        ),
                    ));
                }
                let mut it = args.into_iter();
                (it.next(), it.collect())
            }
            Aggregation::CountDistinct | Aggregation::ApproxCountDistinct => {
                if args.len() < 2 {
                    return Err(err(
                        close_col,
                        format!(
                            "{func} needs a field and at least one group-by field: {func}(window, event, field) BY dim"
                        ),
                    ));
                }
                let field = args.pop();
                (field, args)
            }
        }
    };
    if group.is_empty() {
        return Err(err(
            close_col,
            "at least one group-by field is needed (BY dim)",
        ));
    }
    let field = field_arg.map(|(f, c)| field_name(f, c)).transpose()?;
    let mut group_by = Vec::with_capacity(group.len());
    for (g, c) in group {
        let g = field_name(g, c)?;
        if group_by.contains(&g) {
            return Err(err(c, format!("{g} is grouped by twice")));
        }
        if field.as_ref() == Some(&g) {
            return Err(err(
                c,
                format!("{g} is both the measured field and a group-by field"),
            ));
        }
        group_by.push(g);
    }
    Ok(Parsed {
        aggregation,
        window_ms,
        event,
        field,
        group_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Parsed {
        parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn names(v: &[FieldName]) -> Vec<&str> {
        v.iter().map(FieldName::as_str).collect()
    }

    #[test]
    fn the_seeds_positional_forms() {
        let c = p("COUNT(7d, transaction, device_id)");
        assert_eq!(c.aggregation, Aggregation::Count);
        assert_eq!(c.window_ms, 7 * 86_400_000);
        assert_eq!(c.event.as_str(), "transaction");
        assert_eq!(c.field, None);
        assert_eq!(names(&c.group_by), ["device_id"]);
        assert_eq!(c, p("COUNT(7d, transaction) BY device_id"));

        let s = p("SUM(1d, transaction, amount, userid)");
        assert_eq!(s.field.as_ref().map(FieldName::as_str), Some("amount"));
        assert_eq!(names(&s.group_by), ["userid"]);
        assert_eq!(s, p("sum(1d, transaction, amount) by userid"));

        let d = p("COUNT_DISTINCT(30d, login, device_id, userid)");
        assert_eq!(d.field.as_ref().map(FieldName::as_str), Some("userid"));
        assert_eq!(names(&d.group_by), ["device_id"]);
        assert_eq!(d, p("COUNT_DISTINCT(30d, login, userid) BY device_id"));
    }

    #[test]
    fn by_forms() {
        let a = p("  Approx_Count_Distinct( 1h , page.view , visitor ) BY  site , path ");
        assert_eq!(a.aggregation, Aggregation::ApproxCountDistinct);
        assert_eq!(names(&a.group_by), ["site", "path"]);
        assert_eq!(
            p("MAX(10m, tx, amount) BY merchant").aggregation,
            Aggregation::Max
        );
        assert_eq!(parse_duration("90s"), Ok(90_000));
    }

    #[test]
    fn errors_point_at_the_column() {
        for (src, col, what) in [
            ("COUNTS(7d, tx) BY d", 1, "unknown aggregation"),
            ("COUNT 7d, tx) BY d", 7, "expected '('"),
            ("COUNT(7x, tx) BY d", 7, "duration"),
            ("COUNT(0d, tx) BY d", 7, "positive"),
            ("COUNT(7d tx) BY d", 10, "expected ','"),
            ("COUNT(7d, tx, amount) BY d", 15, "takes no field"),
            ("SUM(7d, tx) BY d", 11, "exactly one field"),
            ("SUM(7d, tx, amount)", 19, "group-by"),
            ("COUNT(7d, tx)", 13, "group-by"),
            ("COUNT(7d, tx) BY", 17, "field name after BY"),
            ("COUNT(7d, tx) BY d, d", 21, "twice"),
            ("COUNT(7d, tx) BY d extra", 20, "unexpected"),
            ("COUNT(7d, tx) FOR d", 15, "expected BY"),
            ("COUNT(7d, t$x) BY d", 12, "unexpected character"),
            ("SUM(1d, tx, amount) BY amount", 24, "both"),
        ] {
            super::super::assert_points_at(parse(src), "invalid_expr", src, col, what);
        }
    }
}
