package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"
)

// The binary bodies match what the broker reads (tests/test_binary_api.py checks the
// Python side of the same layouts).
func TestLLP1AndV3Layout(t *testing.T) {
	body := llp1("t", []entry{{partition: 2, records: [][]byte{[]byte("ab"), []byte("c")}}})
	want := []byte("LLP1\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x02\x00\x03" +
		"\x00\x00\x00\x10" + "\x00\x00\x00\x02\x00" + "\x00\x00\x00\x02\x00\x00\x00\x01" +
		"abc")
	if string(body) != string(want) {
		t.Fatalf("llp1:\n got %q\nwant %q", body, want)
	}
}

func TestParseLLR1(t *testing.T) {
	be := binary.BigEndian
	v3body := v3([][]byte{[]byte("xy"), []byte("z")})
	answer := []byte("LLR1")
	answer = be.AppendUint32(answer, 2)
	answer = append(be.AppendUint16(answer, 1), 't')
	answer = append(be.AppendUint32(answer, 0), 1)
	for _, v := range []uint64{5, 1, 4, 2} {
		answer = be.AppendUint64(answer, v)
	}
	answer = append(answer, 3)
	answer = append(be.AppendUint32(answer, uint32(len(v3body))), v3body...)
	answer = append(be.AppendUint16(answer, 1), 't')
	answer = append(be.AppendUint32(answer, 1), 0)
	answer = append(be.AppendUint32(answer, 2), "{}"...)
	results, ok := parseLLR1(answer, true)
	if !ok || len(results) != 2 {
		t.Fatalf("parse failed: %v %v", ok, results)
	}
	r := results[0]
	if !r.ok || r.nextOffset != 4 || r.highWater != 5 || r.records != 2 || r.recordBytes != 3 ||
		string(r.values[0]) != "xy" || results[1].ok || results[1].err != "{}" {
		t.Fatalf("unexpected %+v", results)
	}
	if _, ok := parseLLR1(answer[:len(answer)-1], false); ok {
		t.Fatal("a truncated answer parsed")
	}
}

func TestJSONRecordsCarryKeysAndHeaders(t *testing.T) {
	body, ctype := requestBody("json", "t", []entry{{partition: 1,
		records: [][]byte{[]byte("v0"), []byte("v1")}}}, extras{keyBytes: 4, headers: 2})
	if ctype != "application/json" {
		t.Fatalf("content type %q", ctype)
	}
	var doc struct {
		TopicPartitions []struct {
			Records []keyedRecord `json:"records"`
		} `json:"topic_partitions"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	recs := doc.TopicPartitions[0].Records
	if len(recs) != 2 || recs[1].Value != "v1" || len(recs[1].Key) != 4 ||
		len(recs[1].Headers) != 2 || len(recs[1].Headers[0].Value) != 16 {
		t.Fatalf("records %+v", recs)
	}
	plain, _ := requestBody("json", "t", []entry{{records: [][]byte{[]byte("v")}}}, extras{})
	if !bytes.Contains(plain, []byte(`"records":["v"]`)) {
		t.Fatalf("plain body %s", plain)
	}
}

// Records from -records-file are each sent once a round, spread over whole rounds of the
// partitions, and a body counts the bytes of the records it carries.
func TestCorpusBodies(t *testing.T) {
	var file []byte
	for _, r := range []string{"a", "bb", "ccc", "dddd", "eeeee"} {
		file = binary.BigEndian.AppendUint32(file, uint32(len(r)))
		file = append(file, r...)
	}
	corpus, err := splitRecords(file)
	if err != nil || len(corpus) != 5 {
		t.Fatalf("split: %v %q", err, corpus)
	}
	c := &config{records: 2, entries: 1, written: []int{0, 1}, format: "binary",
		topic: "t", corpus: corpus}
	bodies, sizes, _, _ := throughputBodies(c)
	// 5 records, 2 per body, 2 partitions: 2 rounds of 2 bodies.
	if len(bodies) != 4 || sizes[0] != 3 || sizes[1] != 7 || sizes[2] != 6 || sizes[3] != 5 {
		t.Fatalf("bodies %d, sizes %v", len(bodies), sizes)
	}
	if _, err := splitRecords(file[:len(file)-1]); err == nil {
		t.Fatal("a truncated record was read")
	}
}
