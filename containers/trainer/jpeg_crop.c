/* Decode only a rectangle of a JPEG: the fast loader's random-resized crop, drawn from the header's size, is
 * all that is decoded. Two ways, the same pixels (those of a whole decode, cropped: tests/unit/trainer/test_jpeg_crop.py
 * compares them):
 *
 * - Any JPEG: libjpeg-turbo's partial decoding (jpeg_crop_scanline, jpeg_skip_scanlines, libjpeg-turbo 1.5 and
 *   later): the rows above the crop are entropy-decoded and skipped, the rows below never read, and only the iMCU
 *   columns that hold the crop go through the inverse DCT, upsampling and colour conversion. The entropy (Huffman)
 *   decoding of every row down to the crop's last remains, most of the time.
 * - A baseline JPEG with a restart marker after every MCU (or every few, dividing a row: `jpeg_crop_add_restarts`
 *   rewrites a JPEG so, losslessly): each restart interval is coded on its own (the DC predictions restart), so
 *   the intervals that hold the crop, and one pixel around it, are copied into a smaller JPEG of their own and
 *   only that is decoded. Nothing outside the crop's MCUs is entropy-decoded.
 *
 * And the fast loader's batches made floats on a CPU device (jpeg_crop_normalise): one pass over the uint8 pixels.
 *
 * Built by trainer/jpeg_crop.py (cc -O3 -ffp-contract=off -shared -fPIC ... -ljpeg: FLAGS there), loaded with ctypes. */
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

struct failure {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char *message; /* JMSG_LENGTH_MAX bytes, the caller's */
};

static void fail(j_common_ptr cinfo) {
  struct failure *f = (struct failure *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, f->message);
  longjmp(f->jump, 1);
}

/* A warning about the data (level -1: corrupt data, a file cut short that libjpeg would fill with grey) fails the
 * decode, as torchvision's whole decode does; the caller then decodes the file whole, or names what is wrong. */
static void refuse_warnings(j_common_ptr cinfo, int level) {
  if (level < 0)
    fail(cinfo);
}

static struct jpeg_error_mgr *failing(struct failure *f, char *message) {
  struct jpeg_error_mgr *mgr = jpeg_std_error(&f->mgr);
  f->mgr.error_exit = fail;
  f->mgr.emit_message = refuse_warnings;
  f->message = message;
  return mgr;
}

int jpeg_crop_message_size(void) { return JMSG_LENGTH_MAX; }

void jpeg_crop_free(void *p) { free(p); }

/* What the markers before the scan say (ITU-T T.81, B.2): the frame's size and components, its MCU, the restart
 * interval, where the frame header and the entropy-coded data start, and whether the file is one baseline or
 * extended-sequential Huffman scan of 8-bit samples holding every component (the kind whose intervals can be cut). */
struct layout {
  int width, height, components, mcu_w, mcu_h, interval, sequential;
  size_t sof, data;
};

static int be16(const unsigned char *p) { return (p[0] << 8) | p[1]; }

/* 0 and `l` filled when the header parses up to the first scan; -1 when it is not a JPEG header this reads. */
static int read_layout(const unsigned char *data, size_t size, struct layout *l) {
  int hmax = 1, vmax = 1;
  memset(l, 0, sizeof *l);
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8)
    return -1;
  for (size_t p = 2; p + 4 <= size;) {
    int marker = data[p + 1];
    if (data[p] != 0xFF)
      return -1;
    if (marker == 0xFF) { /* fill byte */
      p++;
      continue;
    }
    size_t len = be16(data + p + 2);
    if (len < 2 || p + 2 + len > size)
      return -1;
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) { /* SOFn */
      if (len < 8 || l->width)
        return -1;
      l->sof = p;
      l->height = be16(data + p + 5);
      l->width = be16(data + p + 7);
      l->components = data[p + 9];
      if (len < 8 + 3 * (size_t)l->components)
        return -1;
      for (int i = 0; i < l->components; i++) {
        int h = data[p + 11 + 3 * i] >> 4, v = data[p + 11 + 3 * i] & 15;
        hmax = h > hmax ? h : hmax;
        vmax = v > vmax ? v : vmax;
      }
      l->sequential = (marker == 0xC0 || marker == 0xC1) && data[p + 4] == 8;
    } else if (marker == 0xDD && len == 4) {
      l->interval = be16(data + p + 4);
    } else if (marker == 0xDA) {
      if (!l->width || len < 3)
        return -1;
      l->sequential = l->sequential && data[p + 4] == l->components;
      l->data = p + 2 + len;
      /* A scan of one component is not interleaved: its MCU is one block (T.81, A.2.2). */
      l->mcu_w = l->components == 1 ? 8 : 8 * hmax;
      l->mcu_h = l->components == 1 ? 8 : 8 * vmax;
      return l->height > 0 ? 0 : -1; /* a height of 0 (a DNL marker gives it later) is not read here */
    }
    p += 2 + len;
  }
  return -1;
}

/* The image's width, height and components (1 gray, 3 colour, 4 CMYK or YCCK) from its header; -1 when the data
 * does not start with a JPEG header this reads. */
int jpeg_crop_info(const unsigned char *data, unsigned long size, int *info) {
  struct layout l;
  if (read_layout(data, size, &l))
    return -1;
  info[0] = l.width, info[1] = l.height, info[2] = l.components;
  return 0;
}

/* 1 when the JPEG's layout lets jpeg_crop_decode decode only the crop's restart intervals: one sequential scan of
 * every component with a restart interval that divides a row of MCUs (the markers themselves are found when
 * decoding); 0 otherwise. */
static int cuttable(const struct layout *l) {
  return l->sequential && l->interval > 0 && ((l->width + l->mcu_w - 1) / l->mcu_w) % l->interval == 0;
}

int jpeg_crop_cuttable(const unsigned char *data, unsigned long size) {
  struct layout l;
  return read_layout(data, size, &l) == 0 && cuttable(&l);
}

/* Where each restart interval's entropy-coded bytes start (`count` of them, and one past the last's end marker)
 * when the scan holds exactly `count` intervals, ended by the end of image; NULL otherwise (or out of memory). */
static size_t *interval_starts(const unsigned char *data, size_t size, size_t first, size_t count) {
  size_t *starts = malloc((count + 1) * sizeof *starts), n = 0;
  const unsigned char *q = data + first, *end = data + size;
  if (!starts)
    return NULL;
  starts[n++] = first;
  while ((q = memchr(q, 0xFF, end - q)) && q + 1 < end) {
    int b = q[1];
    if (b == 0x00 || b == 0xFF) { /* a stuffed 0xFF byte, or fill bytes before a marker */
      q += b ? 1 : 2;
      continue;
    }
    if ((size_t)b == 0xD0 + ((n - 1) & 7) && n < count) { /* RSTn, numbered in turn (else a whole decode resyncs) */
      starts[n++] = (q + 2) - data;
      q += 2;
      continue;
    }
    if (b == 0xD9 && n == count) { /* EOI: the interval before it ends here */
      starts[n] = (q + 2) - data;
      return starts;
    }
    break; /* another marker (a second scan, DNL), or more intervals than the frame holds */
  }
  free(starts);
  return NULL;
}

/* A JPEG of its own holding the restart intervals that cover rows [top, top+height) and columns [left,
 * left+width) and one pixel around them where the image has it (the fancy upsampling of the chroma reads a pixel's
 * neighbours: without them the crop's edge would differ from a whole decode). Its header is the original's with
 * the frame's size changed; its intervals are the original's bytes with the restart markers numbered anew. *ox,
 * *oy: where the crop starts in it. NULL when the file's layout does not allow it (the caller decodes the usual
 * way). */
static unsigned char *cut_intervals(const unsigned char *data, size_t size, const struct layout *l, int top,
                                    int left, int height, int width, size_t *cut_size, int *ox, int *oy) {
  int across = (l->width + l->mcu_w - 1) / l->mcu_w, down = (l->height + l->mcu_h - 1) / l->mcu_h;
  if (!cuttable(l))
    return NULL;
  int groups = across / l->interval, group_w = l->interval * l->mcu_w;
  size_t *starts = interval_starts(data, size, l->data, (size_t)groups * down);
  if (!starts)
    return NULL;
  int r0 = top > 0 ? (top - 1) / l->mcu_h : 0, r1 = (top + height + l->mcu_h) / l->mcu_h;
  int g0 = left > 0 ? (left - 1) / group_w : 0, g1 = (left + width + group_w) / group_w;
  r1 = r1 < down ? r1 : down;
  g1 = g1 < groups ? g1 : groups;
  unsigned char *cut = malloc(size + 2);
  if (!cut) {
    free(starts);
    return NULL;
  }
  memcpy(cut, data, l->data);
  int h = (r1 * l->mcu_h < l->height ? r1 * l->mcu_h : l->height) - r0 * l->mcu_h;
  int w = (g1 * group_w < l->width ? g1 * group_w : l->width) - g0 * group_w;
  if (w < l->mcu_w && g0 > 0) /* chroma <= 2 samples wide: libjpeg would not use fancy upsampling */
    g0--, w += group_w;
  unsigned char size_bytes[4] = {h >> 8, h & 255, w >> 8, w & 255};
  memcpy(cut + l->sof + 5, size_bytes, 4);
  size_t o = l->data, k = 0;
  for (int r = r0; r < r1; r++)
    for (int g = g0; g < g1; g++, k++) {
      size_t i = (size_t)r * groups + g, from = starts[i], to = starts[i + 1] - 2; /* without its marker */
      if (k) {
        cut[o++] = 0xFF;
        cut[o++] = 0xD0 + ((k - 1) & 7);
      }
      memcpy(cut + o, data + from, to - from);
      o += to - from;
    }
  cut[o++] = 0xFF;
  cut[o++] = 0xD9;
  free(starts);
  *cut_size = o, *oy = top - r0 * l->mcu_h, *ox = left - g0 * group_w;
  return cut;
}

enum { ROWS = 16 }; /* rows asked of libjpeg at a time: one call per row cost 4 % of the decode (measured) */

/* Rows [oy, oy + height) and columns [ox, ox + width) of the JPEG in `data`, as RGB bytes in `out` (height * width *
 * 3): only the iMCU columns holding them are transformed, the rows below are not read. 0, or -1 (`message` set),
 * or -2 (the rectangle is not inside the image), as jpeg_crop_decode. */
static int decode_rows(const unsigned char *data, size_t size, int oy, int ox, int height, int width,
                       unsigned char *out, char *message) {
  struct jpeg_decompress_struct d;
  struct failure f;
  unsigned char *volatile row = NULL;
  memset(&d, 0, sizeof d);
  d.err = failing(&f, message);
  if (setjmp(f.jump)) {
    free(row);
    jpeg_destroy_decompress(&d);
    return -1;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, data, size);
  jpeg_read_header(&d, TRUE);
  if (oy < 0 || ox < 0 || height < 1 || width < 1 || (unsigned)(oy + height) > d.image_height ||
      (unsigned)(ox + width) > d.image_width) {
    jpeg_destroy_decompress(&d);
    return -2;
  }
  d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  /* One column more on each side where the image has one: fancy upsampling of the chroma reads a column's
   * neighbours, and the edges of jpeg_crop_scanline's region have none (measured: up to 22 levels off). */
  int from = ox > 0 ? ox - 1 : 0;
  int to = (unsigned)(ox + width) < d.output_width ? ox + width + 1 : ox + width;
  int least = 2 * d.max_h_samp_factor; /* every component >= 2 samples wide, or libjpeg drops fancy upsampling */
  if (to - from < least) {
    to = from + least < (int)d.output_width ? from + least : (int)d.output_width;
    from = to - least > 0 ? to - least : 0;
  }
  JDIMENSION x = from, w = to - from;
  jpeg_crop_scanline(&d, &x, &w); /* widens the region to whole iMCU columns */
  row = malloc((size_t)w * 3 * ROWS);
  if (!row) {
    jpeg_destroy_decompress(&d);
    strcpy(message, "out of memory");
    return -1;
  }
  if (oy > 0)
    jpeg_skip_scanlines(&d, oy);
  size_t shift = (size_t)(ox - (int)x) * 3, bytes = (size_t)width * 3;
  JSAMPROW rows[ROWS];
  for (int i = 0; i < ROWS; i++)
    rows[i] = row + (size_t)i * w * 3;
  for (int r = 0; r < height;) {
    int got = jpeg_read_scanlines(&d, rows, height - r < ROWS ? height - r : ROWS);
    if (!got) { /* the memory source never suspends: nothing read means nothing more to read */
      free(row);
      jpeg_destroy_decompress(&d);
      strcpy(message, "no more rows in the data");
      return -1;
    }
    for (int i = 0; i < got; i++, r++)
      memcpy(out + (size_t)r * bytes, rows[i] + shift, bytes);
  }
  free(row);
  jpeg_abort_decompress(&d); /* the rows below the crop are never read */
  jpeg_destroy_decompress(&d);
  return 0;
}

/* Rows [top, top + height) and columns [left, left + width) of the JPEG in `data`, as RGB bytes in `out`
 * (height * width * 3). 0 on success; -1 with `message` set when libjpeg refuses the data, -2 when the
 * rectangle is not inside the image; a warning about corrupt data is a failure. Grayscale JPEGs come out as
 * RGB, as from a whole decode. */
int jpeg_crop_decode(const unsigned char *data, unsigned long size, int top, int left, int height, int width,
                     unsigned char *out, char *message) {
  struct layout l;
  size_t cut_size;
  int ox, oy;
  unsigned char *cut = NULL;
  if (read_layout(data, size, &l) == 0 && top >= 0 && left >= 0 && height > 0 && width > 0 &&
      top + height <= l.height && left + width <= l.width)
    cut = cut_intervals(data, size, &l, top, left, height, width, &cut_size, &ox, &oy);
  if (!cut) /* any other JPEG, and anything else (libjpeg names what is wrong with it) */
    return decode_rows(data, size, top, left, height, width, out, message);
  int status = decode_rows(cut, cut_size, oy, ox, height, width, out, message);
  free(cut);
  return status;
}

/* The JPEG in `data` rewritten with a restart marker after every `interval` MCUs, its Huffman tables optimised, its
 * other markers (APPn, COM) kept: the same DCT coefficients, so the same pixels (lossless, as jpegtran -restart).
 * 0 with the new file in *out (free it with jpeg_crop_free), -1 with `message` when libjpeg refuses the data. */
int jpeg_crop_add_restarts(const unsigned char *data, unsigned long size, int interval, unsigned char **out,
                           unsigned long *out_size, char *message) {
  struct jpeg_decompress_struct d;
  struct jpeg_compress_struct c;
  struct failure f; /* one for both, as jpegtran's */
  unsigned char *volatile written = NULL;
  unsigned long written_size = 0;
  memset(&d, 0, sizeof d);
  memset(&c, 0, sizeof c);
  d.err = c.err = failing(&f, message);
  if (setjmp(f.jump)) {
    if (written) /* jpeg_mem_dest's buffer grows by moving: only term_destination stores where it now is */
      (*c.dest->term_destination)(&c);
    jpeg_destroy_compress(&c);
    jpeg_destroy_decompress(&d);
    free(written);
    return -1;
  }
  jpeg_create_decompress(&d);
  jpeg_create_compress(&c);
  jpeg_mem_src(&d, data, size);
  jpeg_save_markers(&d, JPEG_COM, 0xFFFF);
  for (int m = 0; m < 16; m++)
    jpeg_save_markers(&d, JPEG_APP0 + m, 0xFFFF);
  jpeg_read_header(&d, TRUE);
  jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&d);
  jpeg_copy_critical_parameters(&d, &c);
  c.restart_interval = interval;
  c.optimize_coding = TRUE;
  jpeg_mem_dest(&c, (unsigned char **)&written, &written_size);
  jpeg_write_coefficients(&c, coefficients);
  for (jpeg_saved_marker_ptr m = d.marker_list; m; m = m->next) {
    int jfif = m->marker == JPEG_APP0 && m->data_length >= 5 && !memcmp(m->data, "JFIF", 5);
    int adobe = m->marker == JPEG_APP0 + 14 && m->data_length >= 5 && !memcmp(m->data, "Adobe", 5);
    if (!(jfif && c.write_JFIF_header) && !(adobe && c.write_Adobe_marker)) /* libjpeg writes those itself */
      jpeg_write_marker(&c, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(&c);
  jpeg_finish_decompress(&d);
  jpeg_destroy_compress(&c);
  jpeg_destroy_decompress(&d);
  *out = written, *out_size = written_size;
  return 0;
}

/* `n` images of `plane` pixels, their 3 channels interleaved (channels-last uint8, as the fast loader batches them),
 * as floats x * scale[c] + shift[c] in `out`: planes of each channel (`planar`, NCHW) or interleaved (channels
 * last). One pass: torch's uint8 -> float, multiply, add make three over the floats. The multiply and the add are
 * not fused (-ffp-contract=off), so the floats are torch's, bit for bit. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* An AVX2 copy beside the baseline (SSE2) one, chosen when the library loads by what the CPU has: measured 34 us an
 * image against 78 for the planar layout. The images are built on one machine and run on others: no -march. */
__attribute__((target_clones("avx2", "default")))
#endif
void jpeg_crop_normalise(const uint8_t *in, float *out, size_t n, size_t plane, const float *scale,
                         const float *shift, int planar) {
  const float a0 = scale[0], a1 = scale[1], a2 = scale[2], b0 = shift[0], b1 = shift[1], b2 = shift[2];
  for (size_t i = 0; i < n; i++) {
    const uint8_t *s = in + i * plane * 3;
    float *o = out + i * plane * 3;
    if (planar) {
      float *r = o, *g = o + plane, *b = o + 2 * plane;
      for (size_t k = 0; k < plane; k++) {
        r[k] = s[3 * k] * a0 + b0;
        g[k] = s[3 * k + 1] * a1 + b1;
        b[k] = s[3 * k + 2] * a2 + b2;
      }
    } else {
      for (size_t k = 0; k < plane; k++) {
        o[3 * k] = s[3 * k] * a0 + b0;
        o[3 * k + 1] = s[3 * k + 1] * a1 + b1;
        o[3 * k + 2] = s[3 * k + 2] * a2 + b2;
      }
    }
  }
}
