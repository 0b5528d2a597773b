// Reader (and a small writer) for the safetensors format: u64le header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the raw little-endian tensor bytes.
// Tensors are read one at a time with positioned reads, so a multi-GB checkpoint is never held
// in memory twice; F32, F16 and BF16 are converted to Float32Array on the way in.
import { existsSync } from 'node:fs';
import { open, readFile, readdir, writeFile, rename } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { f16Table, f32ToBf16, f32ToF16 } from '../../../common/half.js';

export type StDType = 'F32' | 'F16' | 'BF16';
const DTYPE_SIZE: Record<StDType, number> = { F32: 4, F16: 2, BF16: 2 };

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

interface TensorEntry {
  file: string;
  dtype: StDType;
  shape: number[];
  /** Absolute byte offset of the data within the file. */
  begin: number;
  end: number;
}

export interface TensorData {
  shape: number[];
  dtype: StDType;
  data: Float32Array;
}

function decode(bytes: Uint8Array, dtype: StDType, count: number): Float32Array {
  const out = new Float32Array(count);
  if (dtype === 'F32') {
    new Uint8Array(out.buffer).set(bytes.subarray(0, count * 4));
    return out;
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === 'BF16') {
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < count; i++) bits[i] = dv.getUint16(i * 2, true) << 16;
    return out;
  }
  const lut = f16Table();
  for (let i = 0; i < count; i++) out[i] = lut[dv.getUint16(i * 2, true)]!;
  return out;
}

// ---- reading ---------------------------------------------------------------------------------

async function readHeader(file: string): Promise<Map<string, TensorEntry>> {
  let fh: FileHandle;
  try {
    fh = await open(file, 'r');
  } catch (e) {
    throw new SafetensorsError(`${file}: cannot open (${(e as Error).message})`);
  }
  try {
    const size = (await fh.stat()).size;
    const lenBuf = Buffer.alloc(8);
    if (size < 8 || (await fh.read(lenBuf, 0, 8, 0)).bytesRead !== 8) throw new SafetensorsError(`${file}: truncated (no header length)`);
    const hlen = Number(lenBuf.readBigUInt64LE(0));
    if (hlen <= 0 || hlen > 100 * 1024 * 1024 || 8 + hlen > size) throw new SafetensorsError(`${file}: bad header length ${hlen} for a file of ${size} bytes`);
    const hbuf = Buffer.alloc(hlen);
    await fh.read(hbuf, 0, hlen, 8);
    let header: Record<string, unknown>;
    try {
      header = JSON.parse(hbuf.toString('utf8')) as Record<string, unknown>;
    } catch (e) {
      throw new SafetensorsError(`${file}: header is not valid JSON (${(e as Error).message})`);
    }
    const out = new Map<string, TensorEntry>();
    const dataStart = 8 + hlen;
    for (const [name, v] of Object.entries(header)) {
      if (name === '__metadata__') continue;
      const t = v as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      if (typeof t.dtype !== 'string' || !Array.isArray(t.shape) || !Array.isArray(t.data_offsets) || t.data_offsets.length !== 2) {
        throw new SafetensorsError(`${file}: tensor "${name}" has a malformed header entry`);
      }
      if (!(t.dtype in DTYPE_SIZE)) throw new SafetensorsError(`${file}: tensor "${name}" has dtype ${t.dtype}; supported: F32, F16, BF16`);
      const dtype = t.dtype as StDType;
      const shape = t.shape as number[];
      const [b, e] = t.data_offsets as number[];
      const count = shape.reduce((a, x) => a * x, 1);
      if (typeof b !== 'number' || typeof e !== 'number' || e - b !== count * DTYPE_SIZE[dtype] || dataStart + e > size) {
        throw new SafetensorsError(`${file}: tensor "${name}" offsets [${b}, ${e}) do not match shape [${shape}] ${dtype} or exceed the file`);
      }
      out.set(name, { file, dtype, shape, begin: dataStart + b, end: dataStart + e });
    }
    return out;
  } finally {
    await fh.close();
  }
}

/** All tensors of a checkpoint directory (one file, an index of shards, or every *.safetensors). */
export class SafetensorsCollection {
  private constructor(
    readonly dir: string,
    private readonly entries: Map<string, TensorEntry>,
  ) {}

  static async openFiles(files: string[], dir = ''): Promise<SafetensorsCollection> {
    const entries = new Map<string, TensorEntry>();
    for (const f of files) {
      for (const [name, e] of await readHeader(f)) {
        if (entries.has(name)) throw new SafetensorsError(`tensor "${name}" appears in both ${basename(entries.get(name)!.file)} and ${basename(f)}`);
        entries.set(name, e);
      }
    }
    return new SafetensorsCollection(dir, entries);
  }

  static async openDir(dir: string): Promise<SafetensorsCollection> {
    const indexFile = join(dir, 'model.safetensors.index.json');
    let files: string[];
    if (existsSync(indexFile)) {
      let index: { weight_map?: Record<string, string> };
      try {
        index = JSON.parse(await readFile(indexFile, 'utf8')) as typeof index;
      } catch (e) {
        throw new SafetensorsError(`${indexFile}: not valid JSON (${(e as Error).message})`);
      }
      if (!index.weight_map || typeof index.weight_map !== 'object') throw new SafetensorsError(`${indexFile}: missing "weight_map"`);
      files = [...new Set(Object.values(index.weight_map))].map((f) => join(dir, f));
    } else {
      let names: string[];
      try {
        names = await readdir(dir);
      } catch (e) {
        throw new SafetensorsError(`${dir}: cannot list model directory (${(e as Error).message})`);
      }
      files = names.filter((n) => n.endsWith('.safetensors')).sort().map((n) => join(dir, n));
    }
    if (files.length === 0) throw new SafetensorsError(`${dir}: no *.safetensors files found`);
    return SafetensorsCollection.openFiles(files, dir);
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  names(): string[] {
    return [...this.entries.keys()];
  }

  shape(name: string): number[] | undefined {
    return this.entries.get(name)?.shape;
  }

  /** Reads one tensor's stored bytes. `expectShape` (if given) is checked with a clear error. */
  async getRaw(name: string, expectShape?: number[]): Promise<{ shape: number[]; dtype: StDType; bytes: Uint8Array }> {
    const e = this.entries.get(name);
    if (!e) throw new SafetensorsError(`${this.dir || 'checkpoint'}: missing tensor "${name}"`);
    if (expectShape && (expectShape.length !== e.shape.length || expectShape.some((d, i) => d !== e.shape[i]))) {
      throw new SafetensorsError(`${basename(e.file)}: tensor "${name}" has shape [${e.shape}], expected [${expectShape}]`);
    }
    const fh = await open(e.file, 'r');
    try {
      const bytes = new Uint8Array(e.end - e.begin);
      let off = 0;
      while (off < bytes.length) {
        const { bytesRead } = await fh.read(bytes, off, bytes.length - off, e.begin + off);
        if (bytesRead === 0) throw new SafetensorsError(`${e.file}: unexpected end of file reading "${name}"`);
        off += bytesRead;
      }
      return { shape: e.shape, dtype: e.dtype, bytes };
    } finally {
      await fh.close();
    }
  }

  /** Reads one tensor as f32. `expectShape` (if given) is checked with a clear error. */
  async get(name: string, expectShape?: number[]): Promise<TensorData> {
    const { shape, dtype, bytes } = await this.getRaw(name, expectShape);
    return { shape, dtype, data: decode(bytes, dtype, shape.reduce((a, x) => a * x, 1)) };
  }
}

// ---- writing (built-in model, tests) --------------------------------------------------------

export interface TensorToWrite {
  name: string;
  shape: number[];
  data: Float32Array;
  dtype: StDType;
}

export function encodeSafetensors(tensors: TensorToWrite[], metadata: Record<string, string> = {}): Uint8Array {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let off = 0;
  for (const t of tensors) {
    const count = t.shape.reduce((a, x) => a * x, 1);
    if (count !== t.data.length) throw new SafetensorsError(`tensor "${t.name}": shape [${t.shape}] holds ${count} values, data has ${t.data.length}`);
    const n = count * DTYPE_SIZE[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + n] };
    off += n;
  }
  let hjson = JSON.stringify(header);
  hjson += ' '.repeat((8 - ((8 + Buffer.byteLength(hjson)) % 8)) % 8); // keep data 8-byte aligned
  const hbytes = Buffer.from(hjson, 'utf8');
  const out = new Uint8Array(8 + hbytes.length + off);
  const dv = new DataView(out.buffer);
  dv.setBigUint64(0, BigInt(hbytes.length), true);
  out.set(hbytes, 8);
  let p = 8 + hbytes.length;
  for (const t of tensors) {
    if (t.dtype === 'F32') {
      out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), p);
      p += t.data.byteLength;
    } else {
      const conv = t.dtype === 'F16' ? f32ToF16 : f32ToBf16;
      for (let i = 0; i < t.data.length; i++, p += 2) dv.setUint16(p, conv(t.data[i]!), true);
    }
  }
  return out;
}

/** Writes a safetensors file atomically (temp file + rename). */
export async function writeSafetensors(file: string, tensors: TensorToWrite[], metadata: Record<string, string> = {}): Promise<void> {
  const tmp = `${file}.tmp-${process.pid}-${Date.now()}`;
  await writeFile(tmp, encodeSafetensors(tensors, metadata));
  await rename(tmp, file);
}
