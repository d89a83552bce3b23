// Produces, consumes, uses a consumer group and reads refusals through the client
// oapi-codegen generates (with its default options, into llog.gen.go of this package)
// from the broker's /openapi.json, and prints what it saw as one JSON object, which
// tests/test_generated_clients.py checks. LLOG_URL: the broker; LLOG_TOPIC: a topic
// that may be written, and the name of the group; LLOG_TOKEN: a bearer token allowed to
// produce to and consume it and to use the group.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return v
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func record(build func(*ProduceRecord) error) ProduceRecord {
	var r ProduceRecord
	check(build(&r))
	return r
}

func bytesOf(text string) RecordBytes {
	var b RecordBytes
	check(b.FromRecordBytes0(text))
	return b
}

func fetchOffset(offset int) ConsumeTopicPartition_FetchOffset {
	var o ConsumeTopicPartition_FetchOffset
	check(o.FromConsumeTopicPartitionFetchOffset0(offset))
	return o
}

func main() {
	url, topic, token := os.Getenv("LLOG_URL"), os.Getenv("LLOG_TOPIC"), os.Getenv("LLOG_TOKEN")
	bearer := WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	})
	client := must(NewClientWithResponses(url, bearer))
	ctx := context.Background()
	out := map[string]any{}

	var header Header
	check(header.FromTextHeader(TextHeader{Name: "trace-id", Value: "4bf92f35"}))
	key, timestamp := bytesOf("customer-17"), 1700000000000
	partition := 0
	records := []ProduceRecord{
		record(func(r *ProduceRecord) error { return r.FromProduceRecord0("alpha") }),
		record(func(r *ProduceRecord) error { return r.FromBase64Record(Base64Record{Base64: "AAE="}) }),
		record(func(r *ProduceRecord) error {
			return r.FromRecordObject(RecordObject{Value: bytesOf("order created"), Key: &key,
				Headers: &[]Header{header}, TimestampMs: &timestamp})
		}),
	}
	produced := must(client.ProduceWithResponse(ctx, &ProduceParams{}, ProduceJSONRequestBody{
		TopicPartitions: []ProduceTopicPartition{{Topic: topic, Partition: &partition, Records: records}}}))
	if produced.JSON200 == nil {
		check(fmt.Errorf("produce answered %d: %s", produced.StatusCode(), produced.Body))
	}
	var results []any
	for _, r := range produced.JSON200.Results {
		switch v := must(r.ValueByDiscriminator()).(type) {
		case ProduceSuccess:
			results = append(results, map[string]any{"outcome": v.Outcome, "ok": v.Ok,
				"start": v.StartOffset, "end": v.EndOffset})
		case ProduceFailure:
			results = append(results, map[string]any{"outcome": v.Outcome, "ok": v.Ok,
				"error_type": v.ErrorType})
		}
	}
	out["produced"] = results

	wait := 0
	read := func(offset int) []any {
		answer := must(client.ConsumeWithResponse(ctx, &ConsumeParams{}, ConsumeJSONRequestBody{
			TopicPartitions: []ConsumeTopicPartition{{Topic: topic, Partition: 0,
				FetchOffset: fetchOffset(offset)}}, MaxWaitMs: &wait}))
		if answer.JSON200 == nil {
			check(fmt.Errorf("consume answered %d: %s", answer.StatusCode(), answer.Body))
		}
		var seen []any
		for _, r := range answer.JSON200.Results {
			switch v := must(r.ValueByDiscriminator()).(type) {
			case ConsumeSuccess:
				var got []any
				for _, x := range v.Records {
					var headers [][2]any
					for _, h := range deref(x.Headers) {
						headers = append(headers, [2]any{h.Name, h.Value})
					}
					got = append(got, map[string]any{"offset": x.Offset, "value": x.Value,
						"base64": x.Base64, "key": x.Key, "headers": headers,
						"timestamp_ms": x.TimestampMs})
				}
				seen = append(seen, map[string]any{"outcome": v.Outcome, "records": got})
			case ConsumeFailure:
				seen = append(seen, map[string]any{"outcome": v.Outcome, "ok": v.Ok,
					"error_type": v.ErrorType, "high_watermark": v.HighWatermark})
			}
		}
		return seen
	}
	out["consumed"] = read(1)
	out["out_of_range"] = read(99)

	missing := must(client.DescribeTopicWithResponse(ctx, topic+"-absent", &DescribeTopicParams{}))
	if missing.JSON404 == nil {
		check(fmt.Errorf("describe answered %d: %s", missing.StatusCode(), missing.Body))
	}
	out["unknown_topic"] = []any{missing.StatusCode(), missing.JSON404.ErrorType}
	out["group"] = group(ctx, client, topic)

	anonymous := must(NewClientWithResponses(url))
	refused := must(anonymous.ProduceWithResponse(ctx, &ProduceParams{}, ProduceJSONRequestBody{
		TopicPartitions: []ProduceTopicPartition{{Topic: topic, Partition: &partition,
			Records: records[:1]}}}))
	if refused.JSON401 == nil {
		check(fmt.Errorf("anonymous produce answered %d: %s", refused.StatusCode(), refused.Body))
	}
	out["anonymous"] = []any{refused.StatusCode(), refused.JSON401.ErrorType}
	check(json.NewEncoder(os.Stdout).Encode(out))
}

// group joins, commits, is refused a reset while its member is live, leaves, resets
// twice and describes the group named as the topic.
func group(ctx context.Context, client *ClientWithResponses, topic string) map[string]any {
	out := map[string]any{}
	clientID := "generated"
	joined := must(client.JoinGroupWithResponse(ctx, topic, JoinGroupJSONRequestBody{
		Topics: []string{topic}, ClientId: &clientID}))
	if joined.JSON200 == nil {
		check(fmt.Errorf("join answered %d: %s", joined.StatusCode(), joined.Body))
	}
	member := joined.JSON200
	var assignment []any
	for _, a := range member.Assignment {
		assignment = append(assignment, []any{a.Topic, a.Partitions})
	}
	out["joined"] = assignment

	outcomes := func(results []OffsetResult) []any {
		var seen []any
		for _, r := range results {
			switch v := must(r.ValueByDiscriminator()).(type) {
			case OffsetSuccess:
				seen = append(seen, []any{v.Outcome, v.Partition, v.Offset})
			case OffsetFailure:
				seen = append(seen, []any{v.Outcome, v.Partition, v.ErrorType})
			}
		}
		return seen
	}
	committed := must(client.CommitOffsetsWithResponse(ctx, topic, CommitOffsetsJSONRequestBody{
		MemberId: &member.MemberId, Generation: &member.Generation,
		Offsets: []CommitOffset{{Topic: topic, Partition: 0, Offset: 2}}}))
	if committed.JSON200 == nil {
		check(fmt.Errorf("commit answered %d: %s", committed.StatusCode(), committed.Body))
	}
	var commits []any
	for _, r := range outcomes(committed.JSON200.Results) {
		commits = append(commits, []any{r.([]any)[0], r.([]any)[2]})
	}
	out["committed"] = commits

	var earliest, offset ResetEntry
	check(earliest.FromResetToPosition(ResetToPosition{Topic: topic, To: ResetToPositionToEarliest}))
	partition := 0
	check(offset.FromResetToOffset(ResetToOffset{Topic: topic, Partition: &partition, Offset: 2}))
	reset := func(entry ResetEntry) *ResetOffsetsResponse {
		return must(client.ResetOffsetsWithResponse(ctx, topic, ResetOffsetsJSONRequestBody{
			TopicPartitions: []ResetEntry{entry}}))
	}
	live := reset(earliest)
	if live.JSON409 == nil {
		check(fmt.Errorf("reset of a live group answered %d: %s", live.StatusCode(), live.Body))
	}
	refusal := must(live.JSON409.AsErrorResponse())
	out["reset_while_live"] = []any{live.StatusCode(), refusal.ErrorType}

	left := must(client.LeaveGroupWithResponse(ctx, topic, LeaveGroupJSONRequestBody{
		MemberId: member.MemberId}))
	if left.JSON200 == nil {
		check(fmt.Errorf("leave answered %d: %s", left.StatusCode(), left.Body))
	}
	out["left"] = left.JSON200.Left
	// In this order: the group reads from the start, then from offset 3.
	for _, step := range []struct {
		name  string
		entry ResetEntry
	}{{"reset_earliest", earliest}, {"reset_offset", offset}} {
		done := reset(step.entry)
		if done.JSON200 == nil {
			check(fmt.Errorf("%s answered %d: %s", step.name, done.StatusCode(), done.Body))
		}
		out[step.name] = outcomes(done.JSON200.Results)
	}

	described := must(client.DescribeGroupWithResponse(ctx, topic))
	if described.JSON200 == nil {
		check(fmt.Errorf("describe answered %d: %s", described.StatusCode(), described.Body))
	}
	var partitions []any
	for _, p := range described.JSON200.Partitions {
		partitions = append(partitions, []any{p.Topic, p.Partition, p.CommittedOffset,
			p.HighWatermark, p.Lag})
	}
	out["described"] = map[string]any{"members": len(described.JSON200.Members),
		"partitions": partitions}
	return out
}

func deref[T any](p *[]T) []T {
	if p == nil {
		return nil
	}
	return *p
}
