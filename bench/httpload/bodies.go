package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"strconv"
)

const (
	binaryProduceType = "application/vnd.llog.produce"
	binaryRecordsType = "application/vnd.llog.records"
)

// entry is one topic-partition of a produce request.
type entry struct {
	partition int
	records   [][]byte
}

// extras are what each record carries besides its value (JSON bodies only).
type extras struct {
	keyBytes int
	headers  int
}

type header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type keyedRecord struct {
	Value   string   `json:"value"`
	Key     string   `json:"key,omitempty"`
	Headers []header `json:"headers,omitempty"`
}

// jsonRecords are the records as JSON: plain strings, or objects with a key and headers.
func jsonRecords(records [][]byte, x extras) []any {
	out := make([]any, len(records))
	for j, r := range records {
		if x.keyBytes == 0 && x.headers == 0 {
			out[j] = string(r)
			continue
		}
		rec := keyedRecord{Value: string(r)}
		if x.keyBytes > 0 {
			rec.Key = asciiRecord(x.keyBytes, j)
		}
		for h := 0; h < x.headers; h++ {
			rec.Headers = append(rec.Headers, header{Name: "h" + strconv.Itoa(h),
				Value: asciiRecord(16, j+h)})
		}
		out[j] = rec
	}
	return out
}

// requestBody is a produce body of entries in the chosen format, and its content type.
func requestBody(format, topic string, entries []entry, x extras) ([]byte, string) {
	if format == "binary" {
		return llp1(topic, entries), binaryProduceType
	}
	type tp struct {
		Topic     string `json:"topic"`
		Partition int    `json:"partition"`
		Records   []any  `json:"records"`
	}
	out := make([]tp, len(entries))
	for i, e := range entries {
		out[i] = tp{Topic: topic, Partition: e.partition, Records: jsonRecords(e.records, x)}
	}
	body, err := json.Marshal(map[string][]tp{"topic_partitions": out})
	if err != nil {
		panic(err)
	}
	return body, "application/json"
}

// llp1 is the binary produce envelope with one bytes-batch-v3 body per entry
// (app/wire/produce.py, docs/http-api.md).
func llp1(topic string, entries []entry) []byte {
	be := binary.BigEndian
	out := []byte("LLP1")
	out = be.AppendUint32(out, uint32(len(entries)))
	for _, e := range entries {
		out = be.AppendUint16(out, uint16(len(topic)))
		out = append(out, topic...)
		out = be.AppendUint32(out, uint32(int32(e.partition)))
		out = append(out, 0, 3) // no idempotency key; bytes-batch-v3
		body := v3(e.records)
		out = be.AppendUint32(out, uint32(len(body)))
		out = append(out, body...)
	}
	return out
}

// v3 is a bytes-batch-v3 body of plain records: count, no extra columns, the value
// lengths, then the values (app/storage/columnar.py).
func v3(records [][]byte) []byte {
	be := binary.BigEndian
	out := be.AppendUint32(nil, uint32(len(records)))
	out = append(out, 0)
	for _, r := range records {
		out = be.AppendUint32(out, uint32(len(r)))
	}
	for _, r := range records {
		out = append(out, r...)
	}
	return out
}

// llr1Result is what a reader needs of one partition of a binary consume answer.
type llr1Result struct {
	ok          bool
	nextOffset  int64
	highWater   int64
	records     int
	recordBytes int64
	values      [][]byte // only when asked for
	err         string
}

// parseLLR1 walks a binary consume answer (app/wire/records.py) without copying values
// unless keepValues is set.
func parseLLR1(body []byte, keepValues bool) ([]llr1Result, bool) {
	be := binary.BigEndian
	if len(body) < 8 || string(body[:4]) != "LLR1" {
		return nil, false
	}
	n := int(be.Uint32(body[4:]))
	pos := 8
	out := make([]llr1Result, 0, n)
	need := func(k int) bool { return pos+k <= len(body) }
	for i := 0; i < n; i++ {
		if !need(2) {
			return nil, false
		}
		pos += 2 + int(be.Uint16(body[pos:]))
		if !need(5) {
			return nil, false
		}
		ok := body[pos+4] == 1
		pos += 5
		if !ok {
			if !need(4) {
				return nil, false
			}
			size := int(be.Uint32(body[pos:]))
			if !need(4 + size) {
				return nil, false
			}
			out = append(out, llr1Result{err: string(body[pos+4 : pos+4+size])})
			pos += 4 + size
			continue
		}
		if !need(37) {
			return nil, false
		}
		r := llr1Result{ok: true, highWater: int64(be.Uint64(body[pos:])),
			nextOffset: int64(be.Uint64(body[pos+16:]))}
		encoding := body[pos+32]
		size := int(be.Uint32(body[pos+33:]))
		pos += 37
		if !need(size) {
			return nil, false
		}
		if encoding == 3 && !walkV3(body[pos:pos+size], &r, keepValues) {
			return nil, false
		}
		pos += size
		out = append(out, r)
	}
	return out, pos == len(body)
}

func walkV3(body []byte, r *llr1Result, keepValues bool) bool {
	be := binary.BigEndian
	if len(body) < 5 {
		return false
	}
	count := int(be.Uint32(body))
	columns := body[4]
	width := 4
	if columns&1 != 0 {
		width += 4
	}
	if columns&2 != 0 {
		width += 8
	}
	if columns&4 != 0 {
		width += 8
	}
	lengths := 5
	at := 5 + width*count
	if at > len(body) {
		return false
	}
	r.records = count
	for i := 0; i < count; i++ {
		n := int(be.Uint32(body[lengths+4*i:]))
		if at+n > len(body) {
			return false
		}
		if keepValues {
			r.values = append(r.values, body[at:at+n])
		}
		r.recordBytes += int64(n)
		at += n
	}
	return true
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
