// Produces, consumes, uses a consumer group and reads refusals through the client
// openapi-generator's typescript-fetch generates (into ./generated) from the broker's
// /openapi.json, and prints what it saw as one JSON object, which
// tests/test_generated_clients.py checks. Node 18+ (its global fetch). LLOG_URL: the
// broker; LLOG_TOPIC: a topic that may be written, and the name of the group; LLOG_TOKEN:
// a bearer token allowed to produce to and consume from it and to use the group.
import {
    Configuration, ConsumeApi, ErrorResponseFromJSON, GroupsApi, OffsetResults, ProduceApi,
    ResetEntry, ResponseError, TopicsApi,
} from "./generated";

declare const process: { env: Record<string, string | undefined>; exitCode?: number };

const url = process.env.LLOG_URL ?? "http://127.0.0.1:8080";
const topic = process.env.LLOG_TOPIC ?? "orders";
const token = process.env.LLOG_TOKEN;

async function refusal(call: Promise<unknown>): Promise<[number, string]> {
    try {
        await call;
    } catch (e) {
        if (e instanceof ResponseError) {
            const body = ErrorResponseFromJSON(await e.response.json());
            return [e.response.status, body.errorType];
        }
        throw e;
    }
    throw new Error("expected a refusal");
}

// Join, commit, a refused reset, leave, two resets and a describe of the group named
// as the topic.
async function group(config: Configuration): Promise<Record<string, unknown>> {
    const groups = new GroupsApi(config);
    const member = await groups.joinGroup({ group: topic, joinRequest: {
        topics: [topic], clientId: "generated" } });
    const joined = member.assignment.map((a) => [a.topic, a.partitions]);
    const committed = await groups.commitOffsets({ group: topic, commitRequest: {
        memberId: member.memberId, generation: member.generation,
        offsets: [{ topic, partition: 0, offset: 2 }] } });
    const outcomes = (answer: OffsetResults) => answer.results.map((r) => r.outcome === "success"
        ? [r.outcome, r.partition, r.offset] : [r.outcome, r.partition, r.errorType]);
    const reset = async (...entries: ResetEntry[]) => outcomes(await groups.resetOffsets({
        group: topic, resetRequest: { topicPartitions: entries } }));

    const resetWhileLive = await refusal(reset({ topic, to: "earliest" }));
    const left = await groups.leaveGroup({ group: topic, memberRequest: {
        memberId: member.memberId } });
    const resetEarliest = await reset({ topic, to: "earliest" });
    const resetOffset = await reset({ topic, partition: 0, offset: 2 });
    const described = await groups.describeGroup({ group: topic });
    return {
        joined, committed: outcomes(committed).map(([outcome, , offset]) => [outcome, offset]),
        reset_while_live: resetWhileLive, left: left.left, reset_earliest: resetEarliest,
        reset_offset: resetOffset,
        described: { members: described.members.length, partitions: described.partitions.map(
            (p) => [p.topic, p.partition, p.committedOffset, p.highWatermark, p.lag]) },
    };
}

async function main(): Promise<void> {
    const config = new Configuration({ basePath: url, accessToken: token });
    const written = await new ProduceApi(config).produce({ produceRequest: {
        topicPartitions: [{ topic, partition: 0, records: [
            "alpha",
            { base64: "AAE=" },
            { value: "order created", key: "customer-17",
              headers: [{ name: "trace-id", value: "4bf92f35" }], timestampMs: 1700000000000 },
        ] }],
    } });
    const produced = written.results.map((r) => r.outcome === "success"
        ? { outcome: r.outcome, ok: r.ok, start: r.startOffset, end: r.endOffset }
        : { outcome: r.outcome, ok: r.ok, error_type: r.errorType });

    const consume = new ConsumeApi(config);
    const read = await consume.consume({ consumeRequest: {
        topicPartitions: [{ topic, partition: 0, fetchOffset: 1 }], maxWaitMs: 0 } });
    const consumed = read.results.map((r) => r.outcome === "success"
        ? { outcome: r.outcome, records: r.records.map((x) => ({
            offset: x.offset, value: x.value, base64: x.base64, key: x.key,
            headers: x.headers?.map((h) => [h.name, h.value]), timestamp_ms: x.timestampMs })) }
        : { outcome: r.outcome, error_type: r.errorType });

    const beyond = await consume.consume({ consumeRequest: {
        topicPartitions: [{ topic, partition: 0, fetchOffset: 99 }], maxWaitMs: 0 } });
    const outOfRange = beyond.results.map((r) => r.outcome === "failure"
        ? { outcome: r.outcome, ok: r.ok, error_type: r.errorType, high_watermark: r.highWatermark }
        : { outcome: r.outcome });

    const unknownTopic = await refusal(
        new TopicsApi(config).describeTopic({ topic: `${topic}-absent` }));
    const grouped = await group(config);
    const anonymous = await refusal(new ProduceApi(new Configuration({ basePath: url }))
        .produce({ produceRequest: { topicPartitions: [{ topic, partition: 0, records: ["x"] }] } }));
    console.log(JSON.stringify({ produced, consumed, out_of_range: outOfRange,
                                 unknown_topic: unknownTopic, group: grouped, anonymous }));
}

main().catch((e) => { console.error(e); process.exitCode = 1; });
