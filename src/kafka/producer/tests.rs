use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::FutureRecord;

use super::QuietProducer;

/// Longer than any test runs: a report that waited for the serving thread's idle timeout
/// instead of librdkafka's wake-up would never come, and the test's own guard would fail it.
const FOREVER: Duration = Duration::from_secs(3600);
const GUARD: Duration = Duration::from_secs(10);

fn on_a_mock() -> (MockCluster<'static, DefaultProducerContext>, QuietProducer) {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t", 2, 1).unwrap();
    let config = crate::kafka::client_config(&mock.bootstrap_servers(), &[], &[]);
    let producer = QuietProducer::new(&config, FOREVER).unwrap();
    (mock, producer)
}

/// Every record's future resolves with its own partition and a distinct offset, without the
/// serving thread ever reaching its idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_hears_its_own_report() {
    let (_mock, producer) = on_a_mock();
    let mut sent = Vec::new();
    for i in 0..200 {
        let record = FutureRecord::<(), _>::to("t").partition(i % 2).payload("v");
        sent.push((
            i % 2,
            producer.send_result(record).map_err(|(e, _)| e).unwrap(),
        ));
    }
    let mut offsets = [Vec::new(), Vec::new()];
    for (partition, report) in sent {
        let delivery = tokio::time::timeout(GUARD, report)
            .await
            .expect("reported")
            .expect("not canceled")
            .expect("delivered");
        assert_eq!(delivery.partition, partition);
        offsets[partition as usize].push(delivery.offset);
    }
    for offsets in offsets {
        assert_eq!(offsets, (0..100).collect::<Vec<i64>>());
    }
}

/// After a quiet stretch, with the thread asleep on its socket, the next record still wakes
/// it: one at a time, each awaited before the next is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_after_a_quiet_stretch_wakes_the_thread() {
    let (_mock, producer) = on_a_mock();
    for round in 0..3 {
        let record = FutureRecord::<(), _>::to("t").partition(0).payload("v");
        let delivery = tokio::time::timeout(GUARD, producer.send(record, GUARD))
            .await
            .expect("reported")
            .expect("delivered");
        assert_eq!(delivery.offset, round);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Dropping the last clone stops the thread at once (the stop writes its own wake-up byte),
/// and the clones share one producer until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_clone_stops_the_thread() {
    let (_mock, producer) = on_a_mock();
    let clone = producer.clone();
    drop(producer);
    let record = FutureRecord::<(), _>::to("t").partition(1).payload("v");
    let delivery = tokio::time::timeout(GUARD, clone.send(record, GUARD))
        .await
        .expect("reported")
        .expect("delivered");
    assert_eq!(delivery.offset, 0);
    let dropped = tokio::task::spawn_blocking(move || drop(clone));
    tokio::time::timeout(GUARD, dropped)
        .await
        .expect("the thread stopped without waiting for its idle timeout")
        .unwrap();
}

/// Reports that arrive while the thread serves others are served too. librdkafka writes its
/// wake-up byte only when the queue goes from empty to not empty, so a thread that served a
/// count taken beforehand and went back to sleep left them waiting for its idle timeout (seen
/// as a p99 of 990 ms in the latency benchmark). Many records in flight, one at a time
/// replaced as its report comes, make reports land during serving again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_that_arrive_while_serving_are_served() {
    let (_mock, producer) = on_a_mock();
    let mut in_flight = std::collections::VecDeque::new();
    let send = |i: i32| {
        let record = FutureRecord::<(), _>::to("t").partition(i % 2).payload("v");
        producer.send_result(record).map_err(|(e, _)| e).unwrap()
    };
    for i in 0..20 {
        in_flight.push_back(send(i));
    }
    for i in 20..5_000 {
        let report = in_flight.pop_front().expect("twenty in flight");
        tokio::time::timeout(GUARD, report)
            .await
            .expect("reported")
            .expect("not canceled")
            .expect("delivered");
        in_flight.push_back(send(i));
    }
}
