//! The bounded JSON Patch (RFC 6902) of a group fix: [`apply`] is the only
//! code that applies an operator's patch to a payload (the executor, the
//! CLI's dry run and the dashboard's preview all come here), so a patch
//! runs with the same bounds wherever it runs.
//!
//! A patch is an amplifier: `add /a {"s": 1 KiB}` then 40 × `copy /a ->
//! /a/k{i}` doubles the document at each copy, and a 2.7 KB patch asks for
//! terabytes. So the patch is applied op by op, the document's compact
//! JSON size is kept exactly as it goes, and an op is refused *before* it
//! allocates when it would take the document past [`size_bound`] (at least
//! [`MIN_SIZE_BOUND`], else [`GROWTH_FACTOR`] × the payload), or when the
//! bytes the patch copies or adds in all would pass the same bound (a copy
//! then remove of a large value, over and over, never grows the document
//! but costs a clone each time). A `copy`'s source is measured with an
//! early exit at what is left of both bounds, so measuring a huge value
//! costs no more than the bound. The number of ops is bounded by
//! [`MAX_PATCH_OPS`] when the patch is parsed.
//!
//! Why the ops are implemented here rather than through `json_patch::patch`
//! one op at a time: a `move`'s size change depends on the document between
//! its remove and its add (the same parent shrinks, the target may be the
//! moved value's ancestor), so keeping the size exact through the crate
//! would mean measuring the moved value at each move: 256 moves of a large
//! value back and forth would cost 256 × the bound. Here a move costs only
//! the keys it changes. Pointers are resolved with the crate's own
//! `jsonptr` (the same tokens, indices and `-`), and errors are its
//! `PatchErrorKind`, so a patch means what it meant through the crate.

use json_patch::jsonptr::Pointer;
use json_patch::{PatchErrorKind, PatchOperation as Op};
use serde_json::Value;
use std::fmt::Write as _;

/// The most operations a patch may have: a correction renames, adds or
/// removes a few fields; checked when the patch is parsed.
pub(crate) const MAX_PATCH_OPS: usize = 256;

/// A corrected payload may be this many times its original size (or
/// [`MIN_SIZE_BOUND`], whichever is larger) before the patch is refused.
const GROWTH_FACTOR: usize = 4;

/// The size bound of a small payload: a patch may always grow it to 1 MiB.
const MIN_SIZE_BOUND: usize = 1024 * 1024;

/// Why a patch gave no corrected payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// It passes a bound (size, work) on this payload: the patch is at
    /// fault, not the record; a preview refuses the patch outright.
    Refused(String),
    /// It does not apply to this payload (a `test` fails, a path is
    /// missing, the payload is not JSON): the record is left open.
    NotApplied(String),
}

impl std::fmt::Display for PatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatchError::Refused(m) | PatchError::NotApplied(m) => f.write_str(m),
        }
    }
}

/// The size a payload of `original` bytes may grow to under a patch, and
/// the bytes a patch may copy or add in all: `max(GROWTH_FACTOR × original,
/// MIN_SIZE_BOUND)`.
fn size_bound(original: usize) -> usize {
    original.saturating_mul(GROWTH_FACTOR).max(MIN_SIZE_BOUND)
}

/// `payload` corrected by `ops`, as compact JSON, within the bounds above.
pub(super) fn apply(ops: &[Op], payload: &str) -> Result<String, PatchError> {
    let not_json =
        |e: serde_json::Error| PatchError::NotApplied(format!("the payload is not JSON: {e}"));
    let root: Value = serde_json::from_str(payload).map_err(not_json)?;
    let bound = size_bound(payload.len());
    if ops.len() > MAX_PATCH_OPS {
        return Err(PatchError::Refused(format!(
            "the patch has {} operations; at most {MAX_PATCH_OPS}",
            ops.len()
        )));
    }
    // The payload as parsed may be larger than its text (never by much:
    // escapes only shrink); measured once, within the bound.
    let size = size_within(&root, bound)
        .ok_or_else(|| PatchError::Refused(format!("the payload is over {}", human(bound))))?;
    let mut doc = Doc {
        root,
        size,
        bound,
        work: 0,
    };
    for (i, op) in ops.iter().enumerate() {
        doc.step(op).map_err(|e| e.at(i, op))?;
    }
    let out =
        serde_json::to_string(&doc.root).map_err(|e| PatchError::NotApplied(e.to_string()))?;
    debug_assert_eq!(out.len(), doc.size, "the size kept is the size written");
    Ok(out)
}

/// A document being patched, its compact JSON size kept exactly.
struct Doc {
    root: Value,
    /// `serde_json::to_string(&root).len()`, kept op by op.
    size: usize,
    /// The most `size` may be, and the most `work` may be.
    bound: usize,
    /// Bytes copied or added so far.
    work: usize,
}

/// Why one op failed, before it is told which op it was.
enum StepError {
    /// It would grow the document past the bound.
    Grow(usize),
    /// It would copy or add past the bound in all.
    Work(usize),
    /// It does not apply.
    Kind(PatchErrorKind),
}

impl From<PatchErrorKind> for StepError {
    fn from(k: PatchErrorKind) -> Self {
        StepError::Kind(k)
    }
}

impl StepError {
    /// The error of op `i` (counted from 0, as `json_patch` counts them).
    fn at(self, i: usize, op: &Op) -> PatchError {
        let what = describe(op);
        match self {
            StepError::Grow(b) => PatchError::Refused(format!(
                "the patch would grow the payload past {} at op {i} ({what})",
                human(b)
            )),
            StepError::Work(b) => PatchError::Refused(format!(
                "the patch would copy or add more than {} in all at op {i} ({what})",
                human(b)
            )),
            StepError::Kind(k) => {
                PatchError::NotApplied(format!("the patch does not apply at op {i} ({what}): {k}"))
            }
        }
    }
}

impl Doc {
    fn step(&mut self, op: &Op) -> Result<(), StepError> {
        match op {
            Op::Add(a) => {
                let n = self.spend(&a.value)?;
                self.put(&a.path, a.value.clone(), n)
            }
            Op::Replace(r) => {
                let n = self.spend(&r.value)?;
                let target = self
                    .root
                    .pointer_mut(r.path.as_str())
                    .ok_or(PatchErrorKind::InvalidPointer)?;
                let old = std::mem::replace(target, r.value.clone());
                self.size = self.size + n - size_of(&old);
                self.check()
            }
            Op::Remove(r) => {
                let (old, freed) = take(&mut self.root, &r.path)?;
                self.size -= size_of(&old) + freed;
                Ok(())
            }
            Op::Move(m) => {
                if m.path.starts_with(&m.from) && m.path.len() != m.from.len() {
                    return Err(PatchErrorKind::CannotMoveInsideItself.into());
                }
                let (v, freed) = take(&mut self.root, &m.from).map_err(from_pointer)?;
                // The moved value's own size leaves and comes back: only
                // the keys and commas around it change.
                self.size -= freed;
                let (replaced, overhead) = put(&mut self.root, &m.path, v)?;
                self.size += overhead;
                self.size -= replaced.as_ref().map_or(0, size_of);
                self.check()
            }
            Op::Copy(c) => self.copy(&c.from, &c.path),
            Op::Test(t) => {
                let target = self
                    .root
                    .pointer(t.path.as_str())
                    .ok_or(PatchErrorKind::InvalidPointer)?;
                match *target == t.value {
                    true => Ok(()),
                    false => Err(PatchErrorKind::TestFailed.into()),
                }
            }
        }
    }

    /// The size of `v` (a value of the patch itself, so small), counted
    /// as work.
    fn spend(&mut self, v: &Value) -> Result<usize, StepError> {
        let n = size_within(v, self.bound - self.work).ok_or(StepError::Work(self.bound))?;
        self.work += n;
        Ok(n)
    }

    /// Copy `from` to `path`, measuring the source (with an early exit)
    /// before cloning it.
    fn copy(&mut self, from: &Pointer, path: &Pointer) -> Result<(), StepError> {
        let source = self
            .root
            .pointer(from.as_str())
            .ok_or(PatchErrorKind::InvalidFromPointer)?;
        // What the add would replace (an object's member, or the root)
        // leaves room for the copy.
        let room =
            (self.bound + replaced_size(&self.root, path, self.size)).saturating_sub(self.size);
        let work_left = self.bound - self.work;
        let n = match size_within(source, room.min(work_left)) {
            Some(n) => n,
            None if room <= work_left => return Err(StepError::Grow(self.bound)),
            None => return Err(StepError::Work(self.bound)),
        };
        self.work += n;
        let v = source.clone();
        self.put(path, v, n)
    }

    /// Add `v` (of size `n`) at `path`, the size kept.
    fn put(&mut self, path: &Pointer, v: Value, n: usize) -> Result<(), StepError> {
        let (replaced, overhead) = put(&mut self.root, path, v)?;
        self.size = self.size + n + overhead - replaced.as_ref().map_or(0, size_of);
        self.check()
    }

    fn check(&self) -> Result<(), StepError> {
        match self.size > self.bound {
            true => Err(StepError::Grow(self.bound)),
            false => Ok(()),
        }
    }
}

fn from_pointer(k: PatchErrorKind) -> PatchErrorKind {
    match k {
        PatchErrorKind::InvalidPointer => PatchErrorKind::InvalidFromPointer,
        k => k,
    }
}

/// The size of what an add at `path` would replace: the root (of size
/// `root_size`), or an object's member; 0 for an array's insert or a new
/// member.
fn replaced_size(root: &Value, path: &Pointer, root_size: usize) -> usize {
    let Some((parent, last)) = path.split_back() else {
        return root_size;
    };
    match root.pointer(parent.as_str()) {
        Some(Value::Object(o)) => o.get(last.decoded().as_ref()).map_or(0, size_of),
        _ => 0,
    }
}

/// RFC 6902 `add`: `v` at `path` (the root replaced, an object's member
/// set, inserted in an array); what it replaced, and the bytes of keys,
/// colons and commas the document gained around `v`.
fn put(
    root: &mut Value,
    path: &Pointer,
    v: Value,
) -> Result<(Option<Value>, usize), PatchErrorKind> {
    let Some((parent, last)) = path.split_back() else {
        return Ok((Some(std::mem::replace(root, v)), 0));
    };
    match root.pointer_mut(parent.as_str()) {
        Some(Value::Object(o)) => {
            let key = last.decoded().into_owned();
            let member = str_size(&key) + 1 + usize::from(!o.is_empty());
            match o.insert(key, v) {
                Some(old) => Ok((Some(old), 0)),
                None => Ok((None, member)),
            }
        }
        Some(Value::Array(a)) => {
            let at = last.to_index()?.for_len_incl(a.len())?;
            let comma = usize::from(!a.is_empty());
            a.insert(at, v);
            Ok((None, comma))
        }
        _ => Err(PatchErrorKind::InvalidPointer),
    }
}

/// RFC 6902 `remove` (as `json_patch` reads it: never the root, never
/// `-`): the value taken, and the bytes of keys, colons and commas the
/// document lost around it.
fn take(root: &mut Value, path: &Pointer) -> Result<(Value, usize), PatchErrorKind> {
    let (parent, last) = path.split_back().ok_or(PatchErrorKind::InvalidPointer)?;
    match root.pointer_mut(parent.as_str()) {
        Some(Value::Object(o)) => {
            let key = last.decoded();
            let comma = usize::from(o.len() >= 2);
            let old = o
                .remove(key.as_ref())
                .ok_or(PatchErrorKind::InvalidPointer)?;
            Ok((old, str_size(&key) + 1 + comma))
        }
        Some(Value::Array(a)) => {
            let at = last.to_index()?.for_len(a.len())?;
            let comma = usize::from(a.len() >= 2);
            Ok((a.remove(at), comma))
        }
        _ => Err(PatchErrorKind::InvalidPointer),
    }
}

/// The compact JSON size of a value already in the document (whose size
/// is known to be within the bound).
fn size_of(v: &Value) -> usize {
    size_within(v, usize::MAX).unwrap_or(usize::MAX)
}

/// The compact JSON size of `v` (`serde_json::to_string(v).len()`), or
/// `None` once it passes `budget`: the work is at most about `budget`,
/// whatever `v`'s size.
pub(crate) fn size_within(v: &Value, budget: usize) -> Option<usize> {
    let mut total = 0;
    add_size(v, budget, &mut total).then_some(total)
}

fn add_size(v: &Value, budget: usize, total: &mut usize) -> bool {
    let own = match v {
        Value::Null | Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => {
            let mut w = Counter(0);
            let _ = write!(w, "{n}");
            w.0
        }
        // A string is at least its bytes and quotes: past the budget
        // without reading its escapes.
        Value::String(s) if s.len() + 2 > budget.saturating_sub(*total) => return false,
        Value::String(s) => str_size(s),
        Value::Array(a) => 2 + a.len().saturating_sub(1),
        Value::Object(o) => 2 + o.len().saturating_sub(1) + 3 * o.len(),
    };
    *total += own;
    if *total > budget {
        return false;
    }
    match v {
        Value::Array(a) => a.iter().all(|e| add_size(e, budget, total)),
        Value::Object(o) => o.iter().all(|(k, e)| {
            // The key's quotes and colon are counted above.
            *total += str_size(k) - 2;
            *total <= budget && add_size(e, budget, total)
        }),
        _ => true,
    }
}

/// A string's size as compact JSON, quotes included (serde_json escapes
/// `"`, `\` and the control characters, nothing else).
fn str_size(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\x08' | b'\x0c' | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

struct Counter(usize);

impl std::fmt::Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// `op` in a few words: `copy /a -> /a/k11`.
fn describe(op: &Op) -> String {
    let text = match op {
        Op::Add(a) => format!("add {}", a.path),
        Op::Remove(r) => format!("remove {}", r.path),
        Op::Replace(r) => format!("replace {}", r.path),
        Op::Move(m) => format!("move {} -> {}", m.from, m.path),
        Op::Copy(c) => format!("copy {} -> {}", c.from, c.path),
        Op::Test(t) => format!("test {}", t.path),
    };
    crate::scrub::one_line(&text).chars().take(120).collect()
}

/// `n` bytes, readably: `1 MiB`, `96 KiB`, `1234567 bytes`.
fn human(n: usize) -> String {
    const KIB: usize = 1024;
    match n {
        n if n % (KIB * KIB) == 0 => format!("{} MiB", n / (KIB * KIB)),
        n if n % KIB == 0 => format!("{} KiB", n / KIB),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn ops(v: Value) -> Vec<Op> {
        serde_json::from_value(v).expect("a patch")
    }

    /// The patch of issue 48: a 1 KiB value, then 40 copies of its parent
    /// into itself, each doubling the document.
    fn copy_bomb() -> Vec<Op> {
        let mut p = vec![json!({"op": "add", "path": "/a", "value": {"s": "x".repeat(1024)}})];
        for i in 0..40 {
            p.push(json!({"op": "copy", "from": "/a", "path": format!("/a/k{i}")}));
        }
        ops(Value::Array(p))
    }

    #[test]
    fn the_copy_bomb_is_refused_at_the_op_that_would_pass_the_bound() {
        let err = apply(&copy_bomb(), r#"{"id": 1}"#).unwrap_err();
        // Doubling from about 1 KiB, the tenth copy (op 10) would pass 1 MiB:
        // refused before its clone, the document then about 512 KiB.
        assert_eq!(
            err,
            PatchError::Refused(
                "the patch would grow the payload past 1 MiB at op 10 (copy /a -> /a/k9)".into()
            )
        );
    }

    #[test]
    fn the_bound_grows_with_the_payload() {
        let big = json!({"s": "y".repeat(600 * 1024)}).to_string();
        assert_eq!(size_bound(big.len()), 4 * big.len());
        assert_eq!(size_bound(10), MIN_SIZE_BOUND);
        // Three copies of a 600 KiB payload fit in 4 × its size; a fourth does not.
        let copies = |n: usize| {
            let p: Vec<Value> = (0..n)
                .map(|i| json!({"op": "copy", "from": "/s", "path": format!("/t{i}")}))
                .collect();
            ops(Value::Array(p))
        };
        let three = apply(&copies(3), &big).unwrap();
        assert!(three.len() > 3 * big.len() && three.len() <= size_bound(big.len()));
        let err = apply(&copies(4), &big).unwrap_err().to_string();
        assert!(err.contains("at op 3 (copy /s -> /t3)"), "{err}");
    }

    #[test]
    fn copying_and_removing_a_large_value_over_and_over_is_bounded_as_work() {
        let big = json!({"s": "y".repeat(300 * 1024)}).to_string();
        let mut p = vec![];
        for _ in 0..20 {
            p.push(json!({"op": "copy", "from": "/s", "path": "/t"}));
            p.push(json!({"op": "remove", "path": "/t"}));
        }
        let err = apply(&ops(Value::Array(p)), &big).unwrap_err();
        let PatchError::Refused(m) = err else {
            panic!("refused as work: {err:?}")
        };
        // 4 × 300 KiB of copies in all: the fourth fits, the fifth does not.
        assert!(
            m.contains("more than 1228832 bytes in all") && m.contains("at op 8 (copy /s -> /t)"),
            "{m}"
        );
    }

    #[test]
    fn ordinary_patches_apply() {
        let payload = r#"{"acount":"a-1","items":[1,2],"old":true,"n":{"x":1}}"#;
        let p = ops(json!([
            {"op": "test", "path": "/old", "value": true},
            {"op": "move", "from": "/acount", "path": "/account"},
            {"op": "add", "path": "/items/-", "value": 3},
            {"op": "add", "path": "/items/0", "value": 0},
            {"op": "remove", "path": "/old"},
            {"op": "replace", "path": "/n/x", "value": "one"},
            {"op": "copy", "from": "/n", "path": "/m"},
        ]));
        let out: Value = serde_json::from_str(&apply(&p, payload).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"account":"a-1","items":[0,1,2,3],"n":{"x":"one"},"m":{"x":"one"}})
        );
        let failing = ops(json!([{"op": "test", "path": "/old", "value": false}]));
        let err = apply(&failing, payload).unwrap_err();
        assert_eq!(
            err,
            PatchError::NotApplied(
                "the patch does not apply at op 0 (test /old): value did not match".into()
            )
        );
        let not_json = apply(&failing, "not json").unwrap_err();
        assert!(matches!(not_json, PatchError::NotApplied(m) if m.contains("not JSON")));
    }

    #[test]
    fn too_many_ops_are_refused() {
        let p = ops(Value::Array(vec![
            json!({"op": "test", "path": "", "value": {}});
            MAX_PATCH_OPS + 1
        ]));
        let err = apply(&p, "{}").unwrap_err();
        assert!(matches!(err, PatchError::Refused(m) if m.contains("at most 256")));
    }

    #[test]
    fn a_huge_value_is_measured_no_further_than_the_budget() {
        let huge = Value::Array(vec![json!([1, 2, 3]); 1_000_000]);
        assert_eq!(size_within(&huge, 1000), None);
        assert_eq!(size_within(&json!([1, 2, 3]), 7), Some(7));
        assert_eq!(size_within(&json!([1, 2, 3]), 6), None);
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é€😀/]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c~/\"]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn pointer() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "", "/a", "/b", "/a/b", "/a/0", "/0", "/1", "/-", "/a/-", "/b/a", "/~0", "/~1", "/a/a",
        ])
        .prop_map(str::to_string)
    }

    fn op() -> impl Strategy<Value = Value> {
        prop_oneof![
            (pointer(), value()).prop_map(|(p, v)| json!({"op": "add", "path": p, "value": v})),
            pointer().prop_map(|p| json!({"op": "remove", "path": p})),
            (pointer(), value()).prop_map(|(p, v)| json!({"op": "replace", "path": p, "value": v})),
            (pointer(), pointer()).prop_map(|(f, p)| json!({"op": "move", "from": f, "path": p})),
            (pointer(), pointer()).prop_map(|(f, p)| json!({"op": "copy", "from": f, "path": p})),
            (pointer(), value()).prop_map(|(p, v)| json!({"op": "test", "path": p, "value": v})),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Every value's size is what serde_json writes.
        #[test]
        fn the_size_is_the_compact_json_size(v in value()) {
            prop_assert_eq!(size_within(&v, usize::MAX), Some(serde_json::to_string(&v).unwrap().len()));
        }

        /// Within the bounds, the ops mean what they mean through
        /// `json_patch` (the same result, or both refuse), and the size
        /// kept is the size written (a debug assertion in `apply`).
        #[test]
        fn the_ops_mean_what_json_patch_makes_them_mean(
            doc in value(),
            p in prop::collection::vec(op(), 1..8),
        ) {
            let p = ops(Value::Array(p));
            let payload = doc.to_string();
            // As the payload reads (a float's text need not read back as
            // the same float).
            let mut expected: Value = serde_json::from_str(&payload).unwrap();
            // json-patch 5.0.0 panics ("unable to undo applied patches") on
            // some failed patches (one more reason aqw does not run it):
            // such a case has no oracle.
            let oracle = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut doc = expected.clone();
                json_patch::patch(&mut doc, &p).map(|()| doc)
            }));
            prop_assume!(oracle.is_ok());
            let theirs = oracle.unwrap().map(|doc| expected = doc);
            match (apply(&p, &payload), theirs) {
                (Ok(out), Ok(())) => prop_assert_eq!(out, expected.to_string()),
                (Err(PatchError::NotApplied(_)), Err(_)) => {}
                (ours, theirs) => prop_assert!(false, "{:?} vs {:?}", ours, theirs),
            }
        }

    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// However a patch copies, an accepted result is within the bound.
        #[test]
        fn an_accepted_result_is_within_the_bound(
            doc in value(),
            p in prop::collection::vec(
                (pointer(), pointer()).prop_map(|(f, p)| json!({"op": "copy", "from": f, "path": p})),
                1..64,
            ),
        ) {
            let payload = doc.to_string();
            if let Ok(out) = apply(&ops(Value::Array(p)), &payload) {
                prop_assert!(out.len() <= size_bound(payload.len()));
            }
        }
    }
}
