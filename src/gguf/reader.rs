//! The GGUF header reader: magic, metadata, tensor infos. A GGUF is untrusted input, so every
//! count, length, shape and offset it states is checked against the bytes that are actually left in
//! the file (with checked arithmetic) before anything is allocated for it; a header that asks for
//! more is an error, never a huge allocation. Produces candle's [`Content`] so that the weights are
//! read by candle as before.

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;
use std::collections::HashMap;
use std::io::Read;

/// Array elements summed over all metadata. Each costs a `Value` (32 bytes) in memory whatever its
/// size on disk (one byte for a `u8`), so this, not the file size, bounds the metadata's memory.
/// The largest vocabularies in use (Gemma's 262k tokens; Llama 3's 128k tokens and 280k merges)
/// need under a million.
pub const MAX_METADATA_VALUES: u64 = 1 << 22;
/// Arrays of arrays: no model uses more than one level; the cap bounds the reader's recursion.
const MAX_ARRAY_DEPTH: usize = 4;
/// ggml's GGML_MAX_DIMS.
const MAX_TENSOR_DIMS: u32 = 4;
/// The longest metadata key GGUF allows (its specification: 65,535 bytes).
const MAX_KEY_BYTES: u64 = 65_535;
/// The longest tensor name accepted: ggml's own limit is 63 bytes, so anything near this is
/// damage (and a name goes into error messages, which must stay readable).
const MAX_TENSOR_NAME_BYTES: u64 = 1024;
const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest `general.alignment` accepted (ggml writers use 32; anything this large is damage).
const MAX_ALIGNMENT: u64 = 1 << 16;

#[derive(Debug)]
pub enum HeaderError {
    /// The first four bytes are not `GGUF`.
    NotGguf,
    /// What is wrong, and where.
    Corrupt(String),
}

type HResult<T> = std::result::Result<T, HeaderError>;

fn corrupt<T>(detail: String) -> HResult<T> {
    Err(HeaderError::Corrupt(detail))
}

/// A reader that knows how many bytes the file has left.
struct Header<'a, R: Read> {
    r: &'a mut R,
    pos: u64,
    file_size: u64,
    /// GGUF v1 writes lengths and counts as u32; v2 and v3 as u64.
    v1: bool,
    n_values: u64,
}

impl<R: Read> Header<'_, R> {
    fn remaining(&self) -> u64 {
        self.file_size.saturating_sub(self.pos)
    }

    fn fill(&mut self, buf: &mut [u8], what: &dyn Fn() -> String) -> HResult<()> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return corrupt(format!(
                "{} needs {n} bytes at byte {} but the file ends at byte {}",
                what(),
                self.pos,
                self.file_size
            ));
        }
        self.r.read_exact(buf).or_else(|e| corrupt(format!("{} at byte {}: {e}", what(), self.pos)))?;
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> HResult<[u8; N]> {
        let mut b = [0u8; N];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> HResult<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> HResult<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count: u32 in GGUF v1, u64 after.
    fn len(&mut self, what: &dyn Fn() -> String) -> HResult<u64> {
        if self.v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn len_size(&self) -> u64 {
        if self.v1 {
            4
        } else {
            8
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> HResult<String> {
        self.string_up_to(u64::MAX, what)
    }

    /// A string of at most `max` bytes (a key or a name, which error messages quote).
    fn string_up_to(&mut self, max: u64, what: &dyn Fn() -> String) -> HResult<String> {
        let start = self.pos;
        let n = self.len(what)?;
        if n > max {
            return corrupt(format!("{} at byte {start} is {n} bytes long (at most {max})", what()));
        }
        if n > self.remaining() {
            return corrupt(format!(
                "{} at byte {start} claims {n} bytes but only {} are left in the file",
                what(),
                self.remaining()
            ));
        }
        // Bounded by the check above, so at most the file's own size.
        let mut v = vec![0u8; n as usize];
        self.fill(&mut v, what)?;
        // Some writers NUL-terminate their strings; GGUF strings are not.
        while v.last() == Some(&0) {
            v.pop();
        }
        // A damaged string read lossily would pass for a different one (a merge that never
        // matches splits prompts into twice the tokens), so it is an error.
        String::from_utf8(v).or_else(|e| {
            corrupt(format!(
                "{} at byte {start} is not valid UTF-8 (bad byte at offset {} of the string)",
                what(),
                e.utf8_error().valid_up_to()
            ))
        })
    }

    /// The smallest number of bytes one value of GGUF type `ty` takes on disk.
    fn min_size(&self, ty: u32) -> u64 {
        match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => self.len_size(),
            9 => 4 + self.len_size(),
            _ => 8,
        }
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> HResult<Value> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return corrupt(format!("{}: boolean byte {b} is neither 0 nor 1", what())),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return corrupt(format!("{}: arrays nested deeper than {MAX_ARRAY_DEPTH}", what()));
                }
                let elem_ty = self.u32(what)?;
                check_value_type(elem_ty, what)?;
                let start = self.pos;
                let n = self.len(what)?;
                let needed = n.checked_mul(self.min_size(elem_ty));
                if needed.is_none_or(|b| b > self.remaining()) {
                    return corrupt(format!(
                        "{}: an array at byte {start} claims {n} elements but only {} bytes are left in the file",
                        what(),
                        self.remaining()
                    ));
                }
                self.n_values = self.n_values.saturating_add(n);
                if self.n_values > MAX_METADATA_VALUES {
                    return corrupt(format!(
                        "{}: the metadata holds more than {MAX_METADATA_VALUES} array elements",
                        what()
                    ));
                }
                // Bounded by the two checks above.
                let mut items = Vec::with_capacity(n as usize);
                for k in 0..n {
                    items.push(self.value(elem_ty, depth + 1, &|| format!("{}, element {k}", what()))?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            _ => return corrupt(format!("{}: unknown value type {ty}", what())),
        })
    }
}

fn check_value_type(ty: u32, what: &dyn Fn() -> String) -> HResult<()> {
    match ty {
        0..=12 => Ok(()),
        _ => corrupt(format!("{}: unknown value type {ty}", what())),
    }
}

/// ggml's type numbers for the dtypes candle reads (ggml.h `ggml_type`).
fn dtype_from_u32(v: u32) -> Option<GgmlDType> {
    Some(match v {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// Bytes of a tensor of `dims` in `dtype`, or why it has none (overflow, partial blocks).
pub fn tensor_bytes(dims: &[usize], dtype: GgmlDType) -> std::result::Result<u64, String> {
    let n = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| format!("shape {dims:?} has more elements than fit in 64 bits"))?;
    let block = dtype.block_size() as u64;
    if n % block != 0 {
        return Err(format!("{n} elements do not fill whole blocks of {block}"));
    }
    (n / block).checked_mul(dtype.type_size() as u64).ok_or_else(|| format!("shape {dims:?} overflows its byte size"))
}

/// Read a whole GGUF header from `r`, which holds `file_size` bytes from its current position.
pub fn read_content(r: &mut impl Read, file_size: u64) -> HResult<Content> {
    let mut h = Header { r, pos: 0, file_size, v1: false, n_values: 0 };
    let mut magic = [0u8; 4];
    if file_size < 4 || h.r.read_exact(&mut magic).is_err() || &magic != b"GGUF" {
        return Err(HeaderError::NotGguf);
    }
    h.pos = 4;
    let version = h.u32(&|| "the version".into())?;
    let magic = match version {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => return corrupt(format!("GGUF version {v} (Mentor Lab reads versions 1 to 3)")),
    };
    h.v1 = version == 1;
    let n_tensors = h.len(&|| "the tensor count".into())?;
    let n_kv = h.len(&|| "the metadata count".into())?;
    // Smallest possible entries: a key (its length) + a type + one byte; a tensor name (its
    // length) + n_dims + dtype + offset.
    let min_kv = h.len_size() + 4 + 1;
    let min_tensor = h.len_size() + 4 + 4 + 8;
    let needed = n_kv.checked_mul(min_kv).zip(n_tensors.checked_mul(min_tensor)).and_then(|(a, b)| a.checked_add(b));
    if needed.is_none_or(|b| b > h.remaining()) {
        return corrupt(format!(
            "the header claims {n_tensors} tensors and {n_kv} metadata entries, more than the {} bytes left can hold",
            h.remaining()
        ));
    }

    let mut metadata = HashMap::new();
    for i in 0..n_kv {
        let key = h.string_up_to(MAX_KEY_BYTES, &|| format!("metadata key #{i}"))?;
        let what = || format!("metadata `{key}`");
        let ty = h.u32(&what)?;
        check_value_type(ty, &what)?;
        let value = h.value(ty, 0, &what)?;
        if metadata.insert(key.clone(), value).is_some() {
            return corrupt(format!("metadata key `{key}` appears twice"));
        }
    }

    let mut tensor_infos = HashMap::new();
    for i in 0..n_tensors {
        let name = h.string_up_to(MAX_TENSOR_NAME_BYTES, &|| format!("tensor name #{i}"))?;
        let what = || format!("tensor `{name}`");
        let n_dims = h.u32(&what)?;
        if n_dims > MAX_TENSOR_DIMS {
            return corrupt(format!("tensor `{name}` has {n_dims} dimensions (at most {MAX_TENSOR_DIMS})"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = h.len(&what)?;
            let d = usize::try_from(d).or_else(|_| corrupt(format!("tensor `{name}`: dimension {d} is too large")))?;
            dims.push(d);
        }
        // GGUF lists the fastest-varying dimension first; candle's shapes are row-major.
        dims.reverse();
        let ty = h.u32(&what)?;
        let ggml_dtype =
            dtype_from_u32(ty).ok_or_else(|| HeaderError::Corrupt(format!("tensor `{name}`: unknown dtype {ty}")))?;
        let offset = h.u64(&what)?;
        tensor_bytes(&dims, ggml_dtype).or_else(|e| corrupt(format!("tensor `{name}`: {e}")))?;
        let info = TensorInfo { ggml_dtype, shape: candle_core::Shape::from(dims), offset };
        if tensor_infos.insert(name.clone(), info).is_some() {
            return corrupt(format!("tensor `{name}` appears twice"));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        Some(v) => match v.to_u64().ok().or_else(|| v.to_i32().ok().and_then(|x| u64::try_from(x).ok())) {
            Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
            _ => return corrupt(format!("general.alignment {v:?} is not a power of two up to {MAX_ALIGNMENT}")),
        },
        None => DEFAULT_ALIGNMENT,
    };
    let tensor_data_offset = h.pos.div_ceil(alignment) * alignment;
    let content = Content { magic, metadata, tensor_infos, tensor_data_offset };
    check_tensor_extent(&content, file_size)?;
    Ok(content)
}

/// Every tensor lies inside the file. A download cut short parses (the header is at the front)
/// but its last tensors point past the end: caught here rather than deep inside loading.
fn check_tensor_extent(content: &Content, file_size: u64) -> HResult<()> {
    for (name, info) in &content.tensor_infos {
        let n_bytes = tensor_bytes(info.shape.dims(), info.ggml_dtype).or_else(corrupt)?;
        let end = content.tensor_data_offset.checked_add(info.offset).and_then(|s| s.checked_add(n_bytes));
        match end {
            Some(end) if end <= file_size => {}
            _ => {
                return corrupt(format!(
                    "tensor `{name}` ({n_bytes} bytes at offset {}) ends past the end of the file ({file_size} bytes)",
                    info.offset
                ))
            }
        }
    }
    Ok(())
}
