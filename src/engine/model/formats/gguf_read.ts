// Reader for GGUF files (versions 2 and 3; layout in gguf_format.ts). The header is parsed with a
// bounds check on every read, so a truncated or malformed file is a GgufError naming what is wrong
// and where, never an out-of-range read or a huge allocation; tensor data is read one tensor at a
// time with positioned reads and checked to lie inside the file.
import { open } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { GGML_TYPES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GV, TYPE_LAYOUT, typeBytes, typeName, type GgmlTypeName } from './gguf_format.js';

export class GgufError extends Error {
  override name = 'GgufError';
}

export type GgufValue = number | bigint | boolean | string | GgufValue[];

export interface GgufTensorInfo {
  name: string;
  /** Dims innermost first, as stored. */
  dims: number[];
  type: GgmlTypeName;
  /** Absolute byte offset in the file, and byte length. */
  begin: number;
  bytes: number;
}

/** Header parsing limits: generous for real models, small enough that garbage cannot exhaust memory. */
const MAX_HEADER_BYTES = 512 * 1024 * 1024;
const MAX_COUNT = 10_000_000;

class OutOfData extends Error {}

/** Sequential little-endian reads over a buffer that throw OutOfData past its end. */
class Cursor {
  pos = 0;
  constructor(private readonly b: Buffer) {}
  private need(n: number): void {
    if (this.pos + n > this.b.length) throw new OutOfData();
  }
  u8(): number {
    this.need(1);
    return this.b[this.pos++]!;
  }
  u32(): number {
    this.need(4);
    const v = this.b.readUInt32LE(this.pos);
    this.pos += 4;
    return v;
  }
  u64(what: string): number {
    this.need(8);
    const v = this.b.readBigUInt64LE(this.pos);
    this.pos += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new GgufError(`${what}: value ${v} is out of range`);
    return Number(v);
  }
  scalar(t: number): GgufValue {
    const b = this.b;
    const sizes: Record<number, number> = { [GV.U8]: 1, [GV.I8]: 1, [GV.U16]: 2, [GV.I16]: 2, [GV.U32]: 4, [GV.I32]: 4, [GV.F32]: 4, [GV.BOOL]: 1, [GV.U64]: 8, [GV.I64]: 8, [GV.F64]: 8 };
    const n = sizes[t];
    if (n === undefined) throw new GgufError(`unknown metadata value type ${t}`);
    this.need(n);
    const p = this.pos;
    this.pos += n;
    switch (t) {
      case GV.U8:
        return b.readUInt8(p);
      case GV.I8:
        return b.readInt8(p);
      case GV.U16:
        return b.readUInt16LE(p);
      case GV.I16:
        return b.readInt16LE(p);
      case GV.U32:
        return b.readUInt32LE(p);
      case GV.I32:
        return b.readInt32LE(p);
      case GV.F32:
        return b.readFloatLE(p);
      case GV.BOOL:
        return b.readUInt8(p) !== 0;
      case GV.U64:
      case GV.I64: {
        // 64-bit integers as numbers when exact (ids, lengths, alignment), else as bigint.
        const v = t === GV.U64 ? b.readBigUInt64LE(p) : b.readBigInt64LE(p);
        return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= -BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
      }
      default:
        return b.readDoubleLE(p);
    }
  }
  str(what: string): string {
    const n = this.u64(`${what} (string length)`);
    this.need(n);
    const s = this.b.toString('utf8', this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
  value(t: number, what: string): GgufValue {
    if (t === GV.STRING) return this.str(what);
    if (t === GV.ARRAY) {
      const et = this.u32();
      const n = this.u64(`${what} (array length)`);
      if (n > MAX_COUNT) throw new GgufError(`${what}: array of ${n} elements is too large`);
      if (et === GV.ARRAY) throw new GgufError(`${what}: nested arrays are not supported`);
      const out: GgufValue[] = new Array<GgufValue>(n);
      for (let i = 0; i < n; i++) out[i] = this.value(et, what);
      return out;
    }
    return this.scalar(t);
  }
}

export class GgufFile {
  private constructor(
    readonly file: string,
    readonly version: number,
    readonly meta: Map<string, GgufValue>,
    readonly tensors: Map<string, GgufTensorInfo>,
  ) {}

  static async open(file: string): Promise<GgufFile> {
    let fh: FileHandle;
    try {
      fh = await open(file, 'r');
    } catch (e) {
      throw new GgufError(`${file}: cannot open (${(e as Error).message})`);
    }
    try {
      const size = (await fh.stat()).size;
      // Read a prefix and parse; if the header runs past it, read a larger prefix and retry.
      let len = Math.min(size, 8 * 1024 * 1024);
      for (;;) {
        const buf = Buffer.alloc(len);
        await readFully(fh, buf, 0);
        try {
          return GgufFile.parse(file, buf, size);
        } catch (e) {
          if (!(e instanceof OutOfData)) throw e;
          if (len >= size) throw new GgufError(`${file}: truncated (the header runs past the end of the ${size}-byte file)`);
          if (len >= MAX_HEADER_BYTES) throw new GgufError(`${file}: header larger than ${MAX_HEADER_BYTES} bytes`);
          len = Math.min(size, len * 4, MAX_HEADER_BYTES);
        }
      }
    } finally {
      await fh.close();
    }
  }

  private static parse(file: string, buf: Buffer, size: number): GgufFile {
    const c = new Cursor(buf);
    if (buf.length < 4 || c.u32() !== GGUF_MAGIC) throw new GgufError(`${file}: not a GGUF file (bad magic)`);
    const version = c.u32();
    if (version !== 2 && version !== 3) throw new GgufError(`${file}: GGUF version ${version} is not supported (2 and 3 are)`);
    const nTensors = c.u64('tensor count');
    const nMeta = c.u64('metadata count');
    if (nTensors > MAX_COUNT || nMeta > MAX_COUNT) throw new GgufError(`${file}: implausible counts (${nTensors} tensors, ${nMeta} metadata entries)`);
    const meta = new Map<string, GgufValue>();
    for (let i = 0; i < nMeta; i++) {
      const key = c.str(`metadata key #${i}`);
      const t = c.u32();
      meta.set(key, c.value(t, `metadata "${key}"`));
    }
    const alignV = meta.get('general.alignment') ?? GGUF_DEFAULT_ALIGNMENT;
    const align = typeof alignV === 'number' ? alignV : NaN;
    if (!Number.isInteger(align) || align <= 0 || (align & (align - 1)) !== 0) throw new GgufError(`${file}: general.alignment must be a power of two, got ${String(alignV)}`);
    const infos: { name: string; dims: number[]; type: GgmlTypeName; off: number; bytes: number }[] = [];
    for (let i = 0; i < nTensors; i++) {
      const name = c.str(`tensor #${i} name`);
      const nd = c.u32();
      if (nd < 1 || nd > 4) throw new GgufError(`${file}: tensor "${name}" has ${nd} dimensions (1 to 4 expected)`);
      const dims: number[] = [];
      for (let d = 0; d < nd; d++) dims.push(c.u64(`tensor "${name}" dims`));
      const rawType = c.u32();
      const type = typeName(rawType);
      if (!type) throw new GgufError(`${file}: tensor "${name}" has ggml type ${rawType}; supported: ${Object.keys(GGML_TYPES).join(', ')}`);
      const off = c.u64(`tensor "${name}" offset`);
      const count = dims.reduce((a, x) => a * x, 1);
      if (!Number.isSafeInteger(count) || count <= 0) throw new GgufError(`${file}: tensor "${name}" has dims [${dims}]`);
      if (dims[0]! % TYPE_LAYOUT[type].block !== 0) throw new GgufError(`${file}: tensor "${name}": rows of ${dims[0]} values are not whole ${type} blocks`);
      if (off % align !== 0) throw new GgufError(`${file}: tensor "${name}" offset ${off} is not aligned to ${align}`);
      infos.push({ name, dims, type, off, bytes: typeBytes(type, count) });
    }
    const dataStart = Math.ceil(c.pos / align) * align;
    const tensors = new Map<string, GgufTensorInfo>();
    for (const t of infos) {
      const begin = dataStart + t.off;
      if (begin + t.bytes > size) throw new GgufError(`${file}: tensor "${t.name}" (${t.bytes} bytes at ${begin}) lies beyond the end of the ${size}-byte file`);
      if (tensors.has(t.name)) throw new GgufError(`${file}: tensor "${t.name}" appears twice`);
      tensors.set(t.name, { name: t.name, dims: t.dims, type: t.type, begin, bytes: t.bytes });
    }
    return new GgufFile(file, version, meta, tensors);
  }

  /** Raw bytes of a tensor. */
  async read(name: string): Promise<Uint8Array> {
    const t = this.tensors.get(name);
    if (!t) throw new GgufError(`${this.file}: missing tensor "${name}"`);
    const fh = await open(this.file, 'r');
    try {
      const buf = Buffer.alloc(t.bytes);
      await readFully(fh, buf, t.begin);
      return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    } finally {
      await fh.close();
    }
  }
}

async function readFully(fh: FileHandle, buf: Buffer, at: number): Promise<void> {
  let off = 0;
  while (off < buf.length) {
    const { bytesRead } = await fh.read(buf, off, buf.length - off, at + off);
    if (bytesRead === 0) throw new GgufError('unexpected end of file');
    off += bytesRead;
  }
}
