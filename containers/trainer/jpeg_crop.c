/* Decode only a rectangle of a JPEG: the fast loader's random-resized crop, drawn from the header's size, is
 * all that is decoded. libjpeg-turbo's partial decoding (jpeg_crop_scanline, jpeg_skip_scanlines, libjpeg-turbo
 * 1.5 and later): the rows above the crop are entropy-decoded and skipped, the rows below never read, and only
 * the iMCU columns that hold the crop go through the inverse DCT, upsampling and colour conversion. The pixels
 * are those of a whole decode, cropped (tests/unit/test_jpeg_crop.py compares them).
 *
 * Built by trainer/jpeg_crop.py (cc -O2 -shared ... -ljpeg), loaded with ctypes. */
#include <setjmp.h>
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

int jpeg_crop_message_size(void) { return JMSG_LENGTH_MAX; }

/* Rows [top, top + height) and columns [left, left + width) of the JPEG in `data`, as RGB bytes in `out`
 * (height * width * 3). 0 on success; -1 with `message` set when libjpeg refuses the data, -2 when the
 * rectangle is not inside the image; a warning about corrupt data is a failure. Grayscale JPEGs come out as
 * RGB, as from a whole decode. */
int jpeg_crop_decode(const unsigned char *data, unsigned long size, int top, int left, int height, int width,
                     unsigned char *out, char *message) {
  struct jpeg_decompress_struct d;
  struct failure f;
  unsigned char *volatile row = NULL;
  d.err = jpeg_std_error(&f.mgr);
  f.mgr.error_exit = fail;
  f.mgr.emit_message = refuse_warnings;
  f.message = message;
  if (setjmp(f.jump)) {
    free(row);
    jpeg_destroy_decompress(&d);
    return -1;
  }
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, data, size);
  jpeg_read_header(&d, TRUE);
  if (top < 0 || left < 0 || height < 1 || width < 1 || (unsigned)(top + height) > d.image_height ||
      (unsigned)(left + width) > d.image_width) {
    jpeg_destroy_decompress(&d);
    return -2;
  }
  d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  /* One column more on each side where the image has one: fancy upsampling of the chroma reads a column's
   * neighbours, and the edges of jpeg_crop_scanline's region have none (measured: up to 22 levels off). */
  int from = left > 0 ? left - 1 : 0;
  int to = (unsigned)(left + width) < d.output_width ? left + width + 1 : left + width;
  JDIMENSION x = from, w = to - from;
  jpeg_crop_scanline(&d, &x, &w); /* widens the region to whole iMCU columns */
  row = malloc((size_t)w * 3);
  if (!row) {
    jpeg_destroy_decompress(&d);
    strcpy(message, "out of memory");
    return -1;
  }
  if (top > 0)
    jpeg_skip_scanlines(&d, top);
  size_t shift = (size_t)(left - (int)x) * 3, bytes = (size_t)width * 3;
  for (int r = 0; r < height; r++) {
    JSAMPROW rows[1] = {row};
    jpeg_read_scanlines(&d, rows, 1);
    memcpy(out + (size_t)r * bytes, row + shift, bytes);
  }
  free(row);
  jpeg_abort_decompress(&d); /* the rows below the crop are never read */
  jpeg_destroy_decompress(&d);
  return 0;
}
