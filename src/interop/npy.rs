//! NumPy `.npy` matrices of embeddings: one row per node, float32 or
//! float16, C order, little- or big-endian; shape `(rows, dim)` (or `(dim,)`
//! for one row). Header parsing and writing are npyz's; this module adds
//! the checks a bulk import needs before it writes anything (dtype, order,
//! shape against the file's real size) and streams rows in batches, so a
//! 300 MB matrix is never held whole. Rows are read as raw bytes in bulk
//! and converted a slice at a time (a byte cast for little-endian f32,
//! `half`'s slice conversion for f16): npyz's element iterator costs
//! ~10 ns per value, a third of a 100k x 768 import.

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use npyz::{DType, Endianness, NpyFile, Order, TypeChar, WriterBuilder};

use super::InteropError;

/// Element type of a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpyElement {
    F32,
    F16,
}

impl NpyElement {
    pub fn size_bytes(self) -> u64 {
        match self {
            NpyElement::F32 => 4,
            NpyElement::F16 => 2,
        }
    }

    fn descr(self) -> &'static str {
        match self {
            NpyElement::F32 => "<f4",
            NpyElement::F16 => "<f2",
        }
    }
}

/// What the header says, checked against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyInfo {
    pub row_count: u64,
    pub dim_count: usize,
    pub element: NpyElement,
    /// The dtype as written, e.g. `<f4` (for messages).
    pub descr: String,
}

/// Largest header accepted. NumPy writes a few hundred bytes; the bound
/// keeps a forged length from making us read a whole file as a header.
const MAX_HEADER_BYTES: usize = 1 << 20;

/// Reads a matrix row batch by row batch.
pub struct NpyRowReader {
    path: PathBuf,
    info: NpyInfo,
    /// Positioned at the next unread row.
    file: File,
    big_endian: bool,
    /// Raw bytes of f16 rows before conversion (reused between batches).
    raw: Vec<u16>,
    rows_read: u64,
    /// A read failed part-way: the file position no longer matches
    /// `rows_read`, so every later read fails too.
    failed: bool,
    /// Where row 0 starts in the file (the header's length).
    data_offset_bytes: u64,
}

/// Returns the data offset and the header text.
fn read_prefix(path: &Path, file: &mut impl Read) -> Result<(Vec<u8>, String), InteropError> {
    let bad = |detail: &str| InteropError::invalid(path, format!("not a .npy file: {detail}"));
    let mut fixed = [0u8; 12];
    file.read_exact(&mut fixed).map_err(|_| bad("shorter than a header"))?;
    if &fixed[..6] != b"\x93NUMPY" {
        return Err(bad("no \\x93NUMPY magic"));
    }
    let (text_start, text_len) = match fixed[6] {
        1 => (10usize, usize::from(u16::from_le_bytes([fixed[8], fixed[9]]))),
        2 | 3 => (
            12,
            u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]) as usize,
        ),
        v => return Err(bad(&format!("unknown format version {v}"))),
    };
    if text_len > MAX_HEADER_BYTES {
        return Err(bad(&format!("header of {text_len} bytes")));
    }
    let total = text_start + text_len;
    if total < fixed.len() {
        return Err(bad("header too short"));
    }
    let mut text = vec![0u8; total];
    text[..12].copy_from_slice(&fixed);
    file.read_exact(&mut text[12..]).map_err(|_| bad("truncated header"))?;
    let header = String::from_utf8_lossy(&text[text_start..]).into_owned();
    Ok((text, header))
}

/// Deepest nesting of brackets a header may have: the dict, a shape tuple
/// in it, and a structured dtype's list of tuples (refused later, by
/// name). npyz's parser takes time exponential in the nesting: a header of
/// 176 bytes with an extra key nested 20 deep took 19 s, 22 deep over 60 s.
const MAX_HEADER_NESTING: usize = 3;

/// Refuses a header nested deeper than `MAX_HEADER_NESTING` (brackets in
/// quoted strings are not counted), before npyz parses it.
fn nesting_guard(path: &Path, header: &str) -> Result<(), InteropError> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (at, c) in header.char_indices() {
        match (quote, c) {
            (Some(_), _) if escaped => escaped = false,
            (Some(_), '\\') => escaped = true,
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => {
                depth += 1;
                if depth > MAX_HEADER_NESTING {
                    return Err(InteropError::invalid(
                        path,
                        format!(
                            "bad .npy header: nested deeper than {MAX_HEADER_NESTING} levels (at byte {at} of the header's dict)"
                        ),
                    ));
                }
            }
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            (None, _) => {}
        }
    }
    Ok(())
}

/// The `shape` tuple of a header, if it can be picked out. npyz multiplies
/// the dimensions without overflow checks, so a forged shape is caught
/// here, before npyz sees it.
fn shape_guard(path: &Path, header: &str) -> Result<(), InteropError> {
    let Some(at) = header.find("'shape'").or_else(|| header.find("\"shape\"")) else {
        return Ok(());
    };
    let rest = &header[at..];
    // A tuple by the format's rule, but a list is read too.
    let (Some(open), Some(close)) = (rest.find(['(', '[']), rest.find([')', ']'])) else {
        return Ok(());
    };
    let mut product: u64 = 1;
    for part in rest[open + 1..close.max(open + 1)]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let dim: u64 = part
            .trim_end_matches('L')
            .parse()
            .map_err(|_| InteropError::invalid(path, format!("shape entry {part:?} is not a number")))?;
        product = product
            .checked_mul(dim)
            .filter(|p| *p <= 1 << 48)
            .ok_or_else(|| InteropError::invalid(path, "shape is impossibly large"))?;
    }
    Ok(())
}

/// Rows and columns from the shape and order.
fn matrix_shape(path: &Path, shape: &[u64], order: Order) -> Result<(u64, usize), InteropError> {
    let (rows, dim) = match *shape {
        [dim] => (1, dim),
        [rows, dim] => (rows, dim),
        _ => {
            return Err(InteropError::invalid(
                path,
                format!("shape {shape:?}: expected (rows, dim) or (dim,)"),
            ));
        }
    };
    if order == Order::Fortran && rows > 1 && dim > 1 {
        return Err(InteropError::invalid(
            path,
            "Fortran-order array: rows are not contiguous (save np.ascontiguousarray(a))",
        ));
    }
    let dim = usize::try_from(dim).map_err(|_| InteropError::invalid(path, "dimension too large"))?;
    Ok((rows, dim))
}

/// Element type, dtype text, and whether the bytes are big-endian.
fn element_of(path: &Path, dtype: &DType) -> Result<(NpyElement, String, bool), InteropError> {
    let descr = match dtype {
        DType::Plain(t) => t.to_string(),
        other => other.descr(),
    };
    let (element, big_endian) = match dtype {
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 4 => {
            (NpyElement::F32, t.endianness() == Endianness::Big)
        }
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 2 => {
            (NpyElement::F16, t.endianness() == Endianness::Big)
        }
        _ => {
            return Err(InteropError::invalid(
                path,
                format!("dtype {descr} is not float32 or float16 (convert with a.astype(np.float32))"),
            ));
        }
    };
    Ok((element, descr, big_endian))
}

/// A `.npy` header read and checked from the front of a stream.
pub struct NpyHeader {
    /// The header's bytes as read (magic to the end of the padding).
    pub prefix: Vec<u8>,
    pub info: NpyInfo,
    big_endian: bool,
    /// The data bytes the shape and dtype declare (checked arithmetic).
    pub data_bytes: u64,
}

/// Reads and checks the header at the front of `reader` (which is left at
/// the first data byte): magic, version, shape, dtype and order. A
/// stream that is not a .npy file is refused after at most the header's
/// bytes (bounded by `MAX_HEADER_BYTES`), whatever follows.
pub fn read_header(path: &Path, reader: &mut impl Read) -> Result<NpyHeader, InteropError> {
    let (prefix, header) = read_prefix(path, reader)?;
    nesting_guard(path, &header)?;
    shape_guard(path, &header)?;
    let npy =
        NpyFile::new(prefix.as_slice()).map_err(|e| InteropError::invalid(path, format!("bad .npy header: {e}")))?;
    let (element, descr, big_endian) = element_of(path, &npy.dtype())?;
    let (row_count, dim_count) = matrix_shape(path, npy.shape(), npy.order())?;
    let data_bytes = row_count
        .checked_mul(dim_count as u64)
        .and_then(|n| n.checked_mul(element.size_bytes()))
        .ok_or_else(|| InteropError::invalid(path, "shape is impossibly large"))?;
    Ok(NpyHeader {
        prefix,
        info: NpyInfo {
            row_count,
            dim_count,
            element,
            descr,
        },
        big_endian,
        data_bytes,
    })
}

impl NpyRowReader {
    /// Opens and reads the header. The file is read once, front to back
    /// (a pipe or `/dev/stdin` works); only a regular file's size is
    /// checked up front, a stream's truncation shows when its rows run out.
    pub fn open(path: &Path) -> Result<NpyRowReader, InteropError> {
        let mut file = File::open(path).map_err(InteropError::io("open", path))?;
        let meta = file.metadata().map_err(InteropError::io("stat", path))?;
        let NpyHeader {
            prefix,
            info,
            big_endian,
            data_bytes: need_bytes,
        } = read_header(path, &mut file)?;
        let have_bytes = meta.len().saturating_sub(prefix.len() as u64);
        if meta.is_file() && have_bytes != need_bytes {
            let (row_count, dim_count, descr) = (info.row_count, info.dim_count, &info.descr);
            return Err(InteropError::invalid(
                path,
                format!(
                    "holds {have_bytes} bytes of data but shape ({row_count}, {dim_count}) of {descr} needs {need_bytes}{}",
                    if have_bytes < need_bytes { " (truncated?)" } else { "" }
                ),
            ));
        }
        Ok(NpyRowReader {
            path: path.to_path_buf(),
            info,
            file,
            big_endian,
            raw: Vec::new(),
            rows_read: 0,
            failed: false,
            data_offset_bytes: prefix.len() as u64,
        })
    }

    /// Moves to `row` (at most the row count), so that the next read
    /// starts there: for readers that share a regular file's rows out. A
    /// stream cannot seek and says so.
    pub fn seek_to_row(&mut self, row: u64) -> Result<(), InteropError> {
        use std::io::{Seek, SeekFrom};
        let row = row.min(self.info.row_count);
        let row_bytes = self.info.dim_count as u64 * self.info.element.size_bytes();
        let at = self.data_offset_bytes + row * row_bytes;
        self.file
            .seek(SeekFrom::Start(at))
            .map_err(InteropError::io("seek", &self.path))?;
        self.rows_read = row;
        self.failed = false;
        Ok(())
    }

    pub fn info(&self) -> &NpyInfo {
        &self.info
    }

    /// Rows read so far (the next row's number, from 0).
    pub fn rows_read(&self) -> u64 {
        self.rows_read
    }

    /// Appends up to `max_rows` rows (row after row) to `out` as f32;
    /// returns how many were read (0 at the end).
    pub fn read_rows(&mut self, max_rows: usize, out: &mut Vec<f32>) -> Result<usize, InteropError> {
        let start = out.len();
        self.read_rows_at(max_rows, out, start)
    }

    /// As `read_rows`, into `out` replacing what it held. A buffer already
    /// long enough (a recycled batch column) is not zero-filled first: a
    /// bulk import wrote 12 MB of zeros per batch that the read overwrote.
    pub fn read_rows_into(&mut self, max_rows: usize, out: &mut Vec<f32>) -> Result<usize, InteropError> {
        self.read_rows_at(max_rows, out, 0)
    }

    /// Reads up to `max_rows` rows into `out` from `start` on; `out` ends
    /// after them.
    fn read_rows_at(&mut self, max_rows: usize, out: &mut Vec<f32>, start: usize) -> Result<usize, InteropError> {
        if self.failed {
            return Err(InteropError::Row {
                file: self.path.display().to_string(),
                row: self.rows_read,
                detail: "an earlier read of this file failed".into(),
            });
        }
        let rows = (max_rows as u64).min(self.info.row_count - self.rows_read) as usize;
        let values = rows * self.info.dim_count;
        out.resize(start + values, 0.0);
        let dst = &mut out[start..];
        let read = match self.info.element {
            NpyElement::F32 => {
                let read = self.file.read_exact(bytemuck::cast_slice_mut(dst));
                if self.big_endian != cfg!(target_endian = "big") {
                    dst.iter_mut()
                        .for_each(|x| *x = f32::from_bits(x.to_bits().swap_bytes()));
                }
                read
            }
            NpyElement::F16 => {
                self.raw.resize(values, 0);
                let read = self.file.read_exact(bytemuck::cast_slice_mut(&mut self.raw));
                if self.big_endian != cfg!(target_endian = "big") {
                    self.raw.iter_mut().for_each(|x| *x = x.swap_bytes());
                }
                let halves: &[f16] = self.raw.reinterpret_cast();
                halves.convert_to_f32_slice(dst);
                read
            }
        };
        if let Err(e) = read {
            out.truncate(start);
            self.failed = true;
            // A regular file's size was checked at open: a short read
            // means it changed under us, or a stream ended early.
            return Err(InteropError::Row {
                file: self.path.display().to_string(),
                row: self.rows_read,
                detail: format!(
                    "read failed in rows {}..{}: {e}",
                    self.rows_read,
                    self.rows_read + rows as u64
                ),
            });
        }
        self.rows_read += rows as u64;
        Ok(rows)
    }
}

/// Why a row cannot be stored as an embedding, if it cannot.
pub fn row_problem(row: &[f32]) -> Option<String> {
    // Branch-free folds (they vectorise) for the common all-good row; the
    // slow search runs only to describe a bad one.
    let all_finite = row.iter().fold(true, |ok, x| ok & x.is_finite());
    let any_nonzero = row.iter().fold(false, |nz, x| nz | (*x != 0.0));
    if all_finite && any_nonzero {
        return None;
    }
    if let Some(k) = row.iter().position(|x| !x.is_finite()) {
        return Some(format!("component {k} is {}", row[k]));
    }
    if row.iter().all(|x| *x == 0.0) {
        return Some("the vector is all zeros (cannot be normalised)".into());
    }
    None
}

enum Sink {
    F32(npyz::NpyWriter<f32, BufWriter<File>>),
    F16(npyz::NpyWriter<f16, BufWriter<File>>),
}

/// Writes a `(rows, dim)` C-order matrix through a temporary file renamed
/// into place by [`NpyMatrixWriter::finish`]; dropped unfinished, it
/// removes the temporary file and leaves `path` alone.
pub struct NpyMatrixWriter {
    path: PathBuf,
    output: Option<super::Output>,
    sink: Option<Sink>,
    row_count: u64,
    dim_count: usize,
    rows_written: u64,
}

impl NpyMatrixWriter {
    pub fn create(
        path: &Path,
        row_count: u64,
        dim_count: usize,
        element: NpyElement,
    ) -> Result<NpyMatrixWriter, InteropError> {
        // Errors name `path`, the file the caller asked for, not the
        // temporary sibling it is written through.
        let (file, output) = super::Output::open(path, super::output_target(path)?)?;
        let out = BufWriter::with_capacity(1 << 20, file);
        let dtype = DType::Plain(element.descr().parse().expect("a valid literal type string"));
        let shape = [row_count, dim_count as u64];
        let started = |e| InteropError::io("write", path)(e);
        let sink = match element {
            NpyElement::F32 => Sink::F32(
                npyz::WriteOptions::new()
                    .dtype(dtype)
                    .shape(&shape)
                    .writer(out)
                    .begin_nd()
                    .map_err(started)?,
            ),
            NpyElement::F16 => Sink::F16(
                npyz::WriteOptions::new()
                    .dtype(dtype)
                    .shape(&shape)
                    .writer(out)
                    .begin_nd()
                    .map_err(started)?,
            ),
        };
        Ok(NpyMatrixWriter {
            path: path.to_path_buf(),
            output: Some(output),
            sink: Some(sink),
            row_count,
            dim_count,
            rows_written: 0,
        })
    }

    /// The temporary file the matrix is written through, if any (to be
    /// removed on a signal).
    pub fn temp_path(&self) -> Option<&Path> {
        self.output.as_ref().and_then(|o| o.temp_path())
    }

    pub fn write_row(&mut self, row: &[f32]) -> Result<(), InteropError> {
        if row.len() != self.dim_count || self.rows_written >= self.row_count {
            return Err(InteropError::Row {
                file: self.path.display().to_string(),
                row: self.rows_written,
                detail: format!(
                    "row of {} values does not fit a ({}, {}) matrix",
                    row.len(),
                    self.row_count,
                    self.dim_count
                ),
            });
        }
        let result = match self.sink.as_mut().expect("unfinished writer") {
            Sink::F32(w) => row.iter().try_for_each(|x| w.push(x)),
            Sink::F16(w) => row.iter().try_for_each(|x| w.push(&f16::from_f32(*x))),
        };
        result.map_err(InteropError::io("write", &self.path))?;
        self.rows_written += 1;
        Ok(())
    }

    /// Checks the row count, flushes, fsyncs and renames into place.
    pub fn finish(mut self) -> Result<(), InteropError> {
        if self.rows_written != self.row_count {
            return Err(InteropError::invalid(
                &self.path,
                format!("{} rows written, {} announced", self.rows_written, self.row_count),
            ));
        }
        let finished = match self.sink.take().expect("unfinished writer") {
            Sink::F32(w) => w.finish(),
            Sink::F16(w) => w.finish(),
        };
        finished.map_err(InteropError::io("write", &self.path))?;
        // Taken: a finish that fails removes the temporary file itself.
        self.output.take().expect("unfinished writer").finish()
    }
}

impl Drop for NpyMatrixWriter {
    /// An unfinished or failed write leaves no temporary file.
    fn drop(&mut self) {
        if let Some(output) = &self.output {
            output.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_in_quotes_do_not_count_as_nesting() {
        let path = Path::new("h.npy");
        let shallow = r#"{'descr': '<f4', 'shape': (2, 8), 'a': "((([[[", 'b': '\'(((', }"#;
        assert!(nesting_guard(path, shallow).is_ok());
        assert!(nesting_guard(path, "{'shape': (2, 8), 'x': [[[1]]]}").is_err());
        assert!(nesting_guard(path, "{'descr': [('a', '<f4')], 'shape': (2,)}").is_ok());
    }
}
