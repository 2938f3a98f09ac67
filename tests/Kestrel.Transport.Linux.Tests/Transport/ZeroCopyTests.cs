using System.Buffers;
using System.Collections.Concurrent;
using System.Diagnostics;
using System.Diagnostics.Metrics;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Connection;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Options;
using Microsoft.Win32.SafeHandles;

namespace Kestrel.Transport.Linux.Tests.Transport;

/// <summary>
/// Zero-copy sends (ZeroCopySendThreshold): the kernel reads the app's bytes from pool blocks after the send
/// has returned, so a block may go back to the pool only once the kernel has said it is done with every send
/// over it. On epoll that is sendmsg(MSG_ZEROCOPY) and completions read from the socket's error queue; on
/// io_uring the loop's sends are the ring's SENDMSG_ZC ops and their notifications ring completions
/// (<see cref="Engine"/> runs a test on each). The connection-level and host-level suites also run whole with
/// zero-copy on (TransportKind.LinuxZeroCopy, LinuxIoUringZeroCopy); these tests look at what only it has.
/// </summary>
[Collection(QuietProcess.Name)]
public sealed class ZeroCopyTests(ITestOutputHelper output)
{
    private const string Sends = "kestrel.transport.linux.zerocopy.sends";
    private const string Completions = "kestrel.transport.linux.zerocopy.completions";
    private const string Refused = "kestrel.transport.linux.zerocopy.refused";
    private const int Threshold = 16 * 1024;

    /// <summary>
    /// The engines whose zero-copy sends differ: epoll (sendmsg(MSG_ZEROCOPY) wherever the send is made) and
    /// io_uring with the loop making every send, so that each one is a SENDMSG_ZC op of the ring.
    /// </summary>
    public enum Engine
    {
        Epoll,
        IoUringOps,
    }

    public static TheoryData<Engine> Engines => new() { Engine.Epoll, Engine.IoUringOps };

    [Theory]
    [InlineData(true, Engine.Epoll)]
    [InlineData(false, Engine.Epoll)]
    [InlineData(false, Engine.IoUringOps)]
    public async Task Large_writes_go_out_zero_copy_arrive_intact_and_every_block_comes_back(bool sendFromThreadPool, Engine engine)
    {
        const int Connections = 4;
        const int Length = 2 * 1024 * 1024;
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: true, o => o.Tuning.SendFromThreadPool = sendFromThreadPool);

        var transfers = new List<Task>();
        for (int i = 0; i < Connections; i++)
        {
            ulong seed = (ulong)i + 1;
            var client = await TestSockets.ConnectAsync(await server.BindAsync());
            var connection = await server.AcceptAsync();
            transfers.Add(Task.Run(async () =>
            {
                using (client)
                {
                    var received = client.ReceiveToEndHashedAsync(TestTimeouts.Large);
                    await WriteAsync(connection, seed, Length);
                    await connection.Transport.Output.CompleteAsync();
                    var (length, sha256) = await received;
                    Assert.Equal(Length, length);
                    Assert.Equal(TestData.Sha256(seed, Length), sha256);
                    await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
                }
            }));
        }

        await Task.WhenAll(transfers).WaitAsync(TestTimeouts.Large);

        long sends = server.Recorder.Sum(Sends);
        output.WriteLine($"{sends} zero-copy sends for {Connections} × {Length} bytes.");
        Assert.True(sends >= Connections, $"Expected zero-copy sends on every connection, counted {sends}.");
        Assert.Equal(sends, server.Recorder.Sum(Completions));
        server.AssertNoBlockHeld();
        await server.StopAndAssertPoolCleanAsync();
    }

    /// <summary>
    /// The completions are lost with the fd, so a graceful close waits for them. Over loopback the
    /// client's receive window holds the rest of the data in the server's socket until the client reads.
    /// </summary>
    [Theory]
    [MemberData(nameof(Engines))]
    public async Task A_graceful_close_waits_until_the_kernel_is_done_with_the_zero_copy_sends(Engine engine)
    {
        const int Length = 512 * 1024;
        const ulong Seed = 42;
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: true);
        using var client = await TestSockets.ConnectAsync(await server.BindAsync());
        var connection = await server.AcceptAsync();

        await WriteAsync(connection, Seed, Length);
        await connection.Transport.Output.CompleteAsync();
        await server.WaitUntilSentAsync(Length);
        var linux = Assert.IsType<LinuxConnection>(connection);
        Assert.True(linux.ZeroCopyInFlight > 0, "The client reads nothing, yet every zero-copy send has completed: the test cannot see a premature close.");

        var disposed = connection.DisposeAsync().AsTask();
        await Task.Delay(300);
        Assert.False(disposed.IsCompleted, "The connection closed its fd while the kernel still held zero-copy sends.");
        Assert.True(linux.ZeroCopyInFlight > 0);

        var (length, sha256) = await client.ReceiveToEndHashedAsync(TestTimeouts.Large);
        Assert.Equal(Length, length);
        Assert.Equal(TestData.Sha256(Seed, Length), sha256);
        await disposed.WaitAsync(TestTimeouts.Default);
        Assert.Equal(0, linux.ZeroCopyInFlight);
        server.AssertNoBlockHeld();
        await server.StopAndAssertPoolCleanAsync();
    }

    /// <summary>A reset drops the queued data with the socket, so its blocks go back at once.</summary>
    [Theory]
    [MemberData(nameof(Engines))]
    public async Task An_abort_with_zero_copy_sends_in_flight_resets_and_returns_their_blocks(Engine engine)
    {
        const int Length = 512 * 1024;
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: true);
        using var client = await TestSockets.ConnectAsync(await server.BindAsync());
        var connection = await server.AcceptAsync();

        await WriteAsync(connection, 7, Length);
        await server.WaitUntilSentAsync(Length);
        var linux = Assert.IsType<LinuxConnection>(connection);
        Assert.True(linux.ZeroCopyInFlight > 0, "Every zero-copy send completed before the abort: the test would prove nothing.");

        connection.Abort(new ConnectionAbortedException("test abort"));
        await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        Assert.Equal(0, linux.ZeroCopyInFlight);
        server.AssertNoBlockHeld();

        var error = await Assert.ThrowsAsync<SocketException>(() => client.ReceiveToEndAsync(TestTimeouts.Default));
        Assert.Equal(SocketError.ConnectionReset, error.SocketErrorCode);
        await server.StopAndAssertPoolCleanAsync();
    }

    /// <summary>
    /// Over loopback the kernel copies sends on delivery and says so in the completion; the connection
    /// then stops asking for zero-copy (msg_zerocopy.rst), which costs it nothing to find out. Not every
    /// completion need carry the flag (the kernel merges consecutive completions into one range under
    /// the flag of the range it extends); the switch needs one, so that is the precondition.
    /// </summary>
    [Theory]
    [MemberData(nameof(Engines))]
    public async Task After_the_kernel_reports_a_copy_the_connection_sends_by_copying(Engine engine)
    {
        const int Length = 256 * 1024;
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: false);
        using var client = await TestSockets.ConnectAsync(await server.BindAsync());
        var connection = await server.AcceptAsync();
        Assert.True(Assert.IsType<LinuxConnection>(connection).ZeroCopyEnabled, "The connection has zero-copy off (was SO_ZEROCOPY refused? see the log).");

        // The client can have every byte before the sending thread has counted its send: wait for the
        // transport's own count of bytes sent, which comes after the send's bookkeeping.
        await WriteAsync(connection, 1, Length);
        await client.ReceiveExactlyAsync(new byte[Length], TestTimeouts.Default);
        await server.WaitUntilSentAsync(Length);
        long sends = await server.WaitForAllCompletionsAsync();
        long copied = server.Recorder.Sum(Completions, "kestrel.transport.linux.zerocopy.copied=true");
        long refused = server.Recorder.Sum(Refused);
        output.WriteLine($"{sends} zero-copy sends, {copied} of them completed as copied; {refused} refused with ENOBUFS.");
        Assert.True(sends > 0, $"No send went out with MSG_ZEROCOPY ({refused} refused with ENOBUFS).");
        Assert.True(copied > 0, "The kernel reported no copy over loopback: the test would prove nothing.");

        await WriteAsync(connection, 2, Length);
        await client.ReceiveExactlyAsync(new byte[Length], TestTimeouts.Default);
        await server.WaitUntilSentAsync(2 * Length);
        Assert.Equal(sends, server.Recorder.Sum(Sends));

        await connection.Transport.Output.CompleteAsync();
        await client.ReceiveToEndAsync(TestTimeouts.Default);
        await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        server.AssertNoBlockHeld();
        await server.StopAndAssertPoolCleanAsync();
    }

    /// <summary>
    /// A zero-copy send needs a notification charged to the socket's option memory (msg_zerocopy.rst);
    /// without room the kernel fails it with ENOBUFS, and the connection sends the same bytes again by
    /// copying. In a network namespace whose net.core.optmem_max is 0 the kernel refuses every zero-copy
    /// send, so every byte must go out through that fallback: intact, each refusal counted, nothing held.
    /// (A SENDMSG_ZC op's notification is the ring's, not charged to the socket: epoll only.)
    /// </summary>
    [NetworkNamespaceTheory]
    [InlineData(true)]
    [InlineData(false)]
    public async Task Sends_the_kernel_refuses_with_ENOBUFS_go_out_again_by_copying(bool sendFromThreadPool)
    {
        const int Length = 512 * 1024;
        const ulong Seed = 9;
        await using var server = new ZeroCopyServer(output, Engine.Epoll, keepWhenCopied: true, o => o.Tuning.SendFromThreadPool = sendFromThreadPool);

        await using var inside = await server.BindInNamespaceAsync(clients: 1, prepare: () => File.WriteAllText(NetworkNamespace.OptmemMax, "0"));
        var client = inside.Clients[0];
        var connection = inside.Connections[0];
        var linux = Assert.IsType<LinuxConnection>(connection);
        Assert.True(linux.ZeroCopyEnabled, "The connection has zero-copy off (was SO_ZEROCOPY refused? see the log).");

        var received = client.ReceiveToEndHashedAsync(TestTimeouts.Large);
        await WriteAsync(connection, Seed, Length);
        await connection.Transport.Output.CompleteAsync();
        var (length, sha256) = await received;
        Assert.Equal(Length, length);
        Assert.Equal(TestData.Sha256(Seed, Length), sha256);
        await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);

        long refused = server.Recorder.Sum(Refused);
        long sends = server.Recorder.Sum(Sends);
        output.WriteLine($"{refused} zero-copy sends refused with ENOBUFS, {sends} made.");
        Assert.True(refused > 0, "The kernel refused no zero-copy send: with optmem_max at 0 it should refuse them all, so the test proves nothing.");
        Assert.Equal(0, sends);
        Assert.Equal(0, server.Recorder.Sum(Completions));
        Assert.Equal(0, linux.ZeroCopyInFlight);

        await inside.DisposeAsync();
        server.AssertNoBlockHeld();
        await server.StopAndAssertPoolCleanAsync();
    }

    /// <summary>
    /// A reset drops what the socket still queued, but not the packets already handed to a qdisc or a NIC's ring: the
    /// kernel reads their pages until each zero-copy send's notification. A block back in the pool before then could go
    /// out on the wire carrying whatever the pool put in it next. Here the test's namespace throttles loopback with a
    /// tbf qdisc, so packets wait in it, and the diagnostic pool poisons each block it gets back (0xDD). Eight
    /// connections are reset at once in the middle of their transfers; every byte their clients still receive must be
    /// what was sent, and every block must come back once the kernel is done.
    /// </summary>
    [NetworkNamespaceTheory]
    [MemberData(nameof(Engines))]
    public async Task A_reset_returns_no_zero_copy_block_to_the_pool_while_a_queued_packet_still_points_into_it(Engine engine)
    {
        const int Connections = 8;
        const int Length = 1024 * 1024;
        const int FlowingBytes = 64 * 1024;
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: true);
        await using var inside = await server.BindInNamespaceAsync(Connections);
        inside.Execute("tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "16mbit", "burst", "80kb", "limit", "32mb");

        var readers = inside.Clients.Select((client, i) => new WireReader(client, (ulong)i + 1)).ToArray();
        for (int i = 0; i < Connections; i++)
        {
            await WriteAsync(inside.Connections[i], (ulong)i + 1, Length);
        }

        await WireReader.WhenFlowingAsync(readers, FlowingBytes);

        var linux = inside.Connections.Select(c => Assert.IsType<LinuxConnection>(c)).ToArray();
        Assert.True(linux.All(c => c.ZeroCopyInFlight > 0), "A connection had no zero-copy send in flight at the reset: the test would prove nothing there.");
        foreach (var connection in linux)
        {
            connection.Abort(new ConnectionAbortedException("test reset"));
        }

        await Task.WhenAll(readers.Select(r => r.Done)).WaitAsync(TestTimeouts.Default);
        foreach (var connection in linux)
        {
            await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        }

        output.WriteLine(string.Join(Environment.NewLine, readers.Select((r, i) => $"client {i}: {r.Received} bytes, then {r.Ending}")));
        var corrupt = readers.Select((r, i) => (Reader: r, Index: i)).Where(r => r.Reader.FirstWrong >= 0).ToArray();
        Assert.True(corrupt.Length == 0, $"{corrupt.Length} client(s) received bytes that were never sent, such as connection {corrupt.FirstOrDefault().Index} at offset {corrupt.FirstOrDefault().Reader?.FirstWrong} ({corrupt.FirstOrDefault().Reader?.WrongByte:X2}; {DiagnosticMemoryPoolFactory.PoisonByte:X2} is the pool's poison): a block went back to the pool while a packet still pointed into it.");
        Assert.All(readers, r => Assert.Equal(SocketError.ConnectionReset, r.Ending));
        Assert.All(linux, c => Assert.Equal(0, c.ZeroCopyInFlight));

        await inside.DisposeAsync();
        server.AssertNoBlockHeld();
        await server.StopAndAssertPoolCleanAsync();
    }

    /// <summary>
    /// A stop resets every connection, then waits for their zero-copy notifications, but only
    /// <see cref="Loop.LoopConnections.ZeroCopyStopWaitMs"/>: packets crawling through an 8 kbit/s qdisc hold theirs back far
    /// longer. The stop then closes the sockets, keeps those blocks out of the pool for good (the kernel may still
    /// send from them), and says so in the log.
    /// </summary>
    /// <remarks>
    /// The bucket's first 80 KiB go through at once (the reader sees the data flowing), and the next packet waits in
    /// the qdisc until the rest of its size has trickled in. On loopback that packet is about 32 KiB, of which some 16
    /// KiB are left in the bucket after the burst: at 1,000 bytes/s it leaves the qdisc some 16 s later, far beyond the
    /// stop's wait. (At 64 kbit/s it left after about 2.1 s, just after the wait: a test that was a few tens of ms
    /// late in stopping saw every notification arrive, and the close waited for nothing.)
    /// </remarks>
    [NetworkNamespaceTheory]
    [MemberData(nameof(Engines))]
    public async Task A_stop_waits_for_zero_copy_notifications_only_so_long_and_keeps_their_blocks_from_the_pool(Engine engine)
    {
        const int Length = 512 * 1024;
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: true);
        await using var inside = await server.BindInNamespaceAsync(clients: 1);
        inside.Execute("tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "8kbit", "burst", "80kb", "limit", "32mb");
        var connection = Assert.IsType<LinuxConnection>(inside.Connections[0]);

        // The client reads, so that packets keep going into the qdisc (a full receive window would keep them in the
        // socket's queue, which the reset drops), until the first burst of the bucket is through.
        var reader = new WireReader(inside.Clients[0], 3);
        await WriteAsync(connection, 3, Length);
        await WireReader.WhenFlowingAsync([reader], 64 * 1024);

        // Without packets held in the qdisc the test would prove nothing. They are the proof that the kernel still
        // reads this connection's zero-copy sends (the namespace has no other traffic, and every write is over the
        // threshold). ZeroCopyInFlight is not: a ring op is counted only once its first completion is in, and an op
        // that waits for room in the socket has none yet.
        int abandonedBefore = ZeroCopySends.AbandonedBlocks;
        string qdisc = inside.Execute("tc", "-s", "qdisc", "show", "dev", "lo");
        output.WriteLine($"Before the stop, {connection.ZeroCopyInFlight} zero-copy send(s) counted in flight; {qdisc}");
        Assert.Matches(@"backlog [1-9]\d*b", qdisc);

        var stopping = Stopwatch.StartNew();
        await server.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        output.WriteLine($"The stop took {stopping.ElapsedMilliseconds} ms; {inside.Execute("tc", "-s", "qdisc", "show", "dev", "lo")}");

        int abandoned = ZeroCopySends.AbandonedBlocks - abandonedBefore;
        Assert.True(stopping.ElapsedMilliseconds >= Loop.LoopConnections.ZeroCopyStopWaitMs - 100, $"The stop took {stopping.ElapsedMilliseconds} ms: it did not wait for the notifications.");
        Assert.True(abandoned > 0, "The stop kept no block from the pool, although the kernel still held zero-copy sends.");
        Assert.Contains(server.Logs, l => l.Contains("stopped while the kernel still held zero-copy sends of 1 connection(s)", StringComparison.Ordinal));

        // Exactly the kept blocks are still out of the diagnostic pool: everything else came back.
        Assert.Equal(abandoned, server.Pool.OutstandingCount);
        Assert.Equal(-1, reader.FirstWrong);
    }

    /// <summary>
    /// A pool need not hand out pinned memory (MemoryPool&lt;byte&gt;.Shared does not, nor need one an app registers): a
    /// compacting GC may move its arrays, while the kernel reads a zero-copy send's pages until its notification. Here
    /// the pool's blocks are ordinary arrays with garbage between them; while the sends wait in the socket (the client's
    /// small receive buffer is full), compacting collections run and new arrays full of 0x5A fill the heap. Had a block
    /// moved, its old pages would carry 0x5A to the client.
    /// </summary>
    [Theory]
    [MemberData(nameof(Engines))]
    public async Task Zero_copy_sends_from_a_pool_of_movable_arrays_arrive_intact_across_compacting_collections(Engine engine)
    {
        const int Length = 2 * 1024 * 1024;
        const ulong Seed = 17;
        var pool = new MovableMemoryPoolFactory();
        await using var server = new ZeroCopyServer(output, engine, keepWhenCopied: true, pool: pool);
        var endPoint = await server.BindAsync();
        using var client = new System.Net.Sockets.Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp) { ReceiveBufferSize = 64 * 1024 };
        await client.ConnectAsync(endPoint);
        var connection = await server.AcceptAsync();
        var linux = Assert.IsType<LinuxConnection>(connection);

        await WriteAsync(connection, Seed, Length);
        await connection.Transport.Output.CompleteAsync();
        using (var filling = new CancellationTokenSource(TestTimeouts.Default))
        {
            long sent;
            do
            {
                sent = server.BytesSent;
                await Task.Delay(100, filling.Token);
            }
            while (server.BytesSent != sent || sent < 256 * 1024);
        }

        Assert.True(linux.ZeroCopyInFlight > 0, "No zero-copy send waited in the socket: the test would prove nothing.");
        var filler = new List<byte[]>();
        for (int round = 0; round < 4; round++)
        {
            GC.Collect(2, GCCollectionMode.Forced, blocking: true, compacting: true);
            for (int i = 0; i < 4096; i++)
            {
                var array = new byte[DiagnosticMemoryPoolFactory.BlockSize];
                array.AsSpan().Fill(0x5A);
                filler.Add(array);
            }
        }

        var (length, sha256) = await client.ReceiveToEndHashedAsync(TestTimeouts.Large);
        GC.KeepAlive(filler);
        Assert.Equal(Length, length);
        Assert.True(TestData.Sha256(Seed, Length) == sha256, "The client received other bytes than were sent: a block moved while the kernel still sent from it.");
        await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        await server.DisposeAsync();
        Assert.Equal(0, pool.Outstanding);
    }

    /// <summary>
    /// The bookkeeping alone, over real pool blocks: ids count from the first one modulo 2^32, and blocks
    /// go back in send order once both the pipe and the kernel are done with them.
    /// </summary>
    [Fact]
    public void Completions_return_blocks_in_send_order_across_the_id_wrap()
    {
        var diagnostics = new DiagnosticMemoryPoolFactory();
        var inner = diagnostics.Create();
        var pool = new ZeroCopyMemoryPool(inner);
        var sends = new ZeroCopySends(firstId: uint.MaxValue - 1);

        // Memory the pool did not lend is never sent zero-copy.
        Assert.False(sends.Stage(new ReadOnlySequence<byte>(new byte[64]), 64));
        Assert.False(sends.Commit(SysResult.FromNative(64), notified: false, out _));

        var blocks = new IMemoryOwner<byte>[3];
        for (int i = 0; i < blocks.Length; i++)
        {
            blocks[i] = pool.Rent(DiagnosticMemoryPoolFactory.BlockSize);
            Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[i].Memory), 64));
            if (i == 1)
            {
                // A call that failed took no id: the next one gets it.
                Assert.True(sends.Commit(SysResult.FromNative(-11), notified: false, out _));
                Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[i].Memory), 64));
            }

            Assert.True(sends.Commit(SysResult.FromNative(100), notified: false, out _));
        }

        Assert.Equal(3, sends.InFlight);
        foreach (var block in blocks)
        {
            block.Dispose(); // the pipe lets go
        }

        Assert.Equal(3, pool.Outstanding);

        // Ids are 2^32-2, 2^32-1 and 0. The last completes first: nothing goes back yet.
        Assert.Equal(1, sends.Complete(0, 0, copied: false));
        Assert.Equal(3, sends.InFlight);
        Assert.Equal(3, pool.Outstanding);

        // One range across the wrap completes the first two, and all three go back.
        Assert.Equal(2, sends.Complete(uint.MaxValue - 1, uint.MaxValue, copied: true));
        Assert.True(sends.KernelCopies);
        Assert.Equal(0, sends.InFlight);
        Assert.Equal(0, pool.Outstanding);

        // A block the kernel is done with stays the pipe's until the pipe lets go.
        var held = pool.Rent(DiagnosticMemoryPoolFactory.BlockSize);
        Assert.True(sends.Stage(new ReadOnlySequence<byte>(held.Memory), 64));
        Assert.True(sends.Commit(SysResult.FromNative(1), notified: false, out _));
        Assert.Equal(1, sends.Complete(1, 1, copied: false));
        Assert.Equal(1, pool.Outstanding);
        held.Dispose();
        Assert.Equal(0, pool.Outstanding);

        inner.Dispose();
        diagnostics.AssertAllReturned();
    }

    /// <summary>
    /// The bookkeeping of both kinds of send on one connection (pool threads' sendmsg(MSG_ZEROCOPY) beside the
    /// loop's ring ops): an op takes no kernel id, each kind completes only its own sends, and blocks still go
    /// back in send order. A ring op is held for as long as its notification is to come, also when it failed:
    /// the kernel took it, and only the notification says it is done with the buffers.
    /// </summary>
    [Fact]
    public void Ring_ops_and_error_queue_sends_complete_apart_and_return_blocks_in_send_order()
    {
        var diagnostics = new DiagnosticMemoryPoolFactory();
        var inner = diagnostics.Create();
        var pool = new ZeroCopyMemoryPool(inner);
        var sends = new ZeroCopySends();
        var blocks = new IMemoryOwner<byte>[3];
        uint op;
        for (int i = 0; i < blocks.Length; i++)
        {
            blocks[i] = pool.Rent(DiagnosticMemoryPoolFactory.BlockSize);
        }

        // Kernel id 0, then ring op 7, then kernel id 1 (the op took no id).
        Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[0].Memory), 64));
        Assert.True(sends.Commit(SysResult.FromNative(100), notified: false, out op));
        Assert.Equal(0u, op);
        Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[1].Memory), 64, op: 7));
        Assert.True(sends.Commit(SysResult.FromNative(100), notified: true, out op));
        Assert.Equal(7u, op);

        // An op the engine refused before the kernel saw it holds nothing: no notification will come.
        Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[2].Memory), 64, op: 9));
        Assert.True(sends.Commit(SysResult.FromNative(-105), notified: false, out op));
        Assert.Equal(0u, op);
        Assert.False(sends.CompleteOp(9, copied: false, out _));

        // An op that failed in the kernel is held until its notification, which says so.
        Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[2].Memory), 64, op: 8));
        Assert.True(sends.Commit(SysResult.FromNative(-11), notified: true, out op));
        Assert.Equal(8u, op);

        Assert.True(sends.Stage(new ReadOnlySequence<byte>(blocks[2].Memory), 64));
        Assert.True(sends.Commit(SysResult.FromNative(100), notified: false, out _));
        foreach (var block in blocks)
        {
            block.Dispose();
        }

        // The op first: nothing goes back, the kernel's id 0 is ahead of it.
        Assert.True(sends.CompleteOp(7, copied: false, out bool sent));
        Assert.True(sent);
        Assert.False(sends.CompleteOp(7, copied: false, out _));
        Assert.Equal(3, pool.Outstanding);

        // Kernel ids 0..1 complete as one range: 0 and 1 (the last send), not the ops. Blocks 0 and 1 go back;
        // block 2 waits for the failed op 8, which is ahead of id 1 (both still count as in flight).
        Assert.Equal(2, sends.Complete(0, 1, copied: false));
        Assert.Equal(2, sends.InFlight);
        Assert.Equal(1, pool.Outstanding);
        Assert.True(sends.CompleteOp(8, copied: false, out sent));
        Assert.False(sent);
        Assert.Equal(0, sends.InFlight);
        Assert.Equal(0, pool.Outstanding);
        Assert.False(sends.KernelCopies);

        inner.Dispose();
        diagnostics.AssertAllReturned();
    }

    private static async Task WriteAsync(ConnectionContext connection, ulong seed, int length)
    {
        var chunk = new byte[64 * 1024];
        for (int position = 0; position < length; position += chunk.Length)
        {
            int size = Math.Min(chunk.Length, length - position);
            TestData.Fill(seed, position, chunk.AsSpan(0, size));
            var flush = await connection.Transport.Output.WriteAsync(chunk.AsMemory(0, size)).AsTask().WaitAsync(TestTimeouts.Large);
            Assert.False(flush.IsCompleted, "The transport completed the output before the data was written.");
        }
    }

    /// <summary>A Linux transport with zero-copy sends from 16 KiB, its meter and its checked memory pool.</summary>
    private sealed class ZeroCopyServer : IAsyncDisposable
    {
        private readonly ServiceProvider _services;
        private readonly DiagnosticMemoryPoolFactory _pool = new();
        private readonly LinuxTransportFactory _factory;
        private readonly Microsoft.Extensions.Logging.ILoggerFactory _loggerFactory;
        private readonly Engine _engine;
        private IConnectionListener? _listener;
        private bool _disposed;

        /// <summary>Every log line of the transport.</summary>
        public ConcurrentQueue<string> Logs { get; } = new();

        public DiagnosticMemoryPoolFactory Pool => _pool;

        /// <summary>A server whose pools come from <paramref name="pool"/>; the checked diagnostic one (<see cref="Pool"/>) when null.</summary>
        public ZeroCopyServer(ITestOutputHelper output, Engine engine, bool keepWhenCopied, Action<LinuxTransportOptions>? configure = null, IMemoryPoolFactory<byte>? pool = null)
        {
            _engine = engine;
            TransportKind.LinuxNative.AssertEngineAvailable();
            _services = new ServiceCollection().AddMetrics().BuildServiceProvider();
            var meterFactory = _services.GetRequiredService<IMeterFactory>();
            Recorder = new MeasurementRecorder(meterFactory);
            var options = new LinuxTransportOptions
            {
                ThreadCount = 2,
                ZeroCopySendThreshold = Threshold,

                // Room for the test's whole write in the pipe, so the app never waits on the client.
                MaxWriteBufferSize = 4 * 1024 * 1024,
                IoBackend = engine == Engine.IoUringOps ? IoBackend.IoUring : IoBackend.Epoll,
            };

            // On the ring only the loop submits: its sends are the ops under test.
            options.Tuning.SendFromThreadPool = engine != Engine.IoUringOps;
            options.Tuning.ZeroCopyWhenKernelCopies = keepWhenCopied;
            configure?.Invoke(options);
            _loggerFactory = TestOutputLoggerProvider.CreateFactory(output, record: Logs);
            _factory = new LinuxTransportFactory(Options.Create(options), _loggerFactory, pool ?? _pool, meterFactory);
        }

        public MeasurementRecorder Recorder { get; }

        public LinuxTransportFactory Factory => _factory;

        /// <summary>Binds a loopback listener on the first call; returns its endpoint.</summary>
        public async Task<EndPoint> BindAsync()
        {
            if (_listener is null)
            {
                _listener = await _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
                foreach (var loop in _factory.Loops)
                {
                    // Without SENDMSG_ZC (Linux 6.2) the io_uring run would only repeat epoll's sendmsg(MSG_ZEROCOPY).
                    Assert.Equal(_engine == Engine.IoUringOps, loop.Engine.SendsZeroCopyAsOps);
                }
            }

            return _listener.EndPoint;
        }

        /// <summary>
        /// Starts the loops here, in the host's namespace, then binds a listener inside a network namespace of the
        /// test's own (after <paramref name="prepare"/> ran there) and connects <paramref name="clients"/> clients to it.
        /// </summary>
        public async Task<Namespaced> BindInNamespaceAsync(int clients, Action? prepare = null)
        {
            await BindAsync();
            var (listener, sockets, handle) = NetworkNamespace.Run(() =>
            {
                prepare?.Invoke();
                var handle = NetworkNamespace.Open();
                var listener = _factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0)).AsTask().GetAwaiter().GetResult();
                var sockets = new System.Net.Sockets.Socket[clients];
                for (int i = 0; i < clients; i++)
                {
                    sockets[i] = new System.Net.Sockets.Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
                    sockets[i].Connect(listener.EndPoint);
                }

                return (listener, sockets, handle);
            }, out string id);

            // The loops accept in their own order: Connections[i] is Clients[i]'s.
            var connections = new ConnectionContext[clients];
            for (int i = 0; i < clients; i++)
            {
                var connection = await listener.AcceptAsync().AsTask().WaitAsync(TestTimeouts.Default) ?? throw new InvalidOperationException("The listener stopped.");
                connections[Array.FindIndex(sockets, c => Equals(c.LocalEndPoint, connection.RemoteEndPoint))] = connection;
            }

            return new Namespaced(id, handle, listener, sockets, connections);
        }

        public async Task<ConnectionContext> AcceptAsync()
        {
            Assert.NotNull(_listener);
            var connection = await _listener.AcceptAsync().AsTask().WaitAsync(TestTimeouts.Default);
            Assert.NotNull(connection);
            return connection;
        }

        /// <summary>Waits until the transport has handed <paramref name="bytes"/> to the kernel.</summary>
        public async Task WaitUntilSentAsync(long bytes)
        {
            using var cts = new CancellationTokenSource(TestTimeouts.Default);
            long sent;
            while ((sent = SentBytes()) < bytes)
            {
                await Task.Delay(10, cts.Token);
            }

            Assert.Equal(bytes, sent);
        }

        /// <summary>
        /// Waits until the kernel has completed every zero-copy send counted so far; returns their number.
        /// Only sends already counted: call it after <see cref="WaitUntilSentAsync"/>.
        /// </summary>
        public async Task<long> WaitForAllCompletionsAsync()
        {
            using var cts = new CancellationTokenSource(TestTimeouts.Default);
            while (Recorder.Sum(Completions) < Recorder.Sum(Sends))
            {
                await Task.Delay(10, cts.Token);
            }

            Assert.Equal(Recorder.Sum(Sends), Recorder.Sum(Completions));
            return Recorder.Sum(Sends);
        }

        /// <summary>Every block of the output pipes is back in the loops' pools.</summary>
        public void AssertNoBlockHeld()
        {
            foreach (var loop in _factory.Loops)
            {
                Assert.NotNull(loop.ZeroCopyPool);
                Assert.Equal(0, loop.ZeroCopyPool.Outstanding);
            }
        }

        /// <summary>
        /// The test's last step: stops the transport, then checks that every block of its pool came
        /// back. (Not in DisposeAsync: an assertion thrown from there would replace the exception of a
        /// test that failed earlier, and hide it.)
        /// </summary>
        public async Task StopAndAssertPoolCleanAsync()
        {
            await DisposeAsync();
            Assert.True(_pool.TotalRented > 0);
            _pool.AssertAllReturned();
        }

        public async ValueTask DisposeAsync()
        {
            if (_disposed)
            {
                return;
            }

            _disposed = true;
            if (_listener is not null)
            {
                await _listener.DisposeAsync();
            }

            await _factory.DisposeAsync();
            Recorder.Dispose();
            await _services.DisposeAsync();
            _loggerFactory.Dispose();
        }

        /// <summary>What the transport has handed to the kernel so far.</summary>
        public long BytesSent => SentBytes();

        private long SentBytes() => _factory.Loops.Sum(l => l.BytesSent);
    }

    /// <summary>What <see cref="ZeroCopyServer.BindInNamespaceAsync"/> set up in the test's network namespace.</summary>
    private sealed class Namespaced(string id, SafeFileHandle handle, IConnectionListener listener, System.Net.Sockets.Socket[] clients, ConnectionContext[] connections) : IAsyncDisposable
    {
        private bool _disposed;

        public System.Net.Sockets.Socket[] Clients { get; } = clients;

        public ConnectionContext[] Connections { get; } = connections;

        /// <summary>Runs a command (tc) in the namespace; returns what it printed.</summary>
        public string Execute(params string[] command) => NetworkNamespace.Execute(handle, command);

        /// <summary>Closes the clients, the listener and the namespace, and checks that no thread of the process is left in it.</summary>
        public async ValueTask DisposeAsync()
        {
            if (_disposed)
            {
                return;
            }

            _disposed = true;
            foreach (var client in Clients)
            {
                client.Dispose();
            }

            await listener.DisposeAsync();
            handle.Dispose();

            // The namespace's own thread has returned from its body; give the OS thread the moment it takes to exit.
            var inside = NetworkNamespace.ThreadsInside(id);
            for (var waited = Stopwatch.StartNew(); inside.Count > 0 && waited.Elapsed < TestTimeouts.ThreadExit; inside = NetworkNamespace.ThreadsInside(id))
            {
                await Task.Delay(20);
            }

            Assert.True(inside.Count == 0, $"Threads of the process are still in the test's network namespace: {string.Join(", ", inside)}");
        }
    }

    /// <summary>A client that reads until the connection ends, checking each byte against what was sent.</summary>
    private sealed class WireReader
    {
        private long _received;

        public WireReader(System.Net.Sockets.Socket client, ulong seed) => Done = ReadAsync(client, seed);

        public long Received => Interlocked.Read(ref _received);

        /// <summary>The stream offset of the first byte that was not what was sent, or -1.</summary>
        public long FirstWrong { get; private set; } = -1;

        public byte WrongByte { get; private set; }

        /// <summary>How the connection ended: Success for end of stream, else the socket error.</summary>
        public SocketError Ending { get; private set; }

        public Task Done { get; }

        /// <summary>Waits until each of <paramref name="readers"/> has received at least <paramref name="bytes"/>.</summary>
        public static async Task WhenFlowingAsync(IReadOnlyList<WireReader> readers, long bytes)
        {
            using var flowing = new CancellationTokenSource(TestTimeouts.Default);
            while (readers.Any(r => r.Received < bytes))
            {
                await Task.Delay(10, flowing.Token);
            }
        }

        private async Task ReadAsync(System.Net.Sockets.Socket client, ulong seed)
        {
            var buffer = new byte[64 * 1024];
            var expected = new byte[buffer.Length];
            try
            {
                int read;
                while ((read = await client.ReceiveAsync(buffer, SocketFlags.None)) > 0)
                {
                    TestData.Fill(seed, _received, expected.AsSpan(0, read));
                    int wrong = buffer.AsSpan(0, read).CommonPrefixLength(expected.AsSpan(0, read));
                    if (wrong < read && FirstWrong < 0)
                    {
                        FirstWrong = _received + wrong;
                        WrongByte = buffer[wrong];
                    }

                    Interlocked.Add(ref _received, read);
                }

                Ending = SocketError.Success;
            }
            catch (SocketException e)
            {
                Ending = e.SocketErrorCode;
            }
        }
    }

    /// <summary>
    /// Pools that promise nothing about pinning: each block is an ordinary array, rented with an unreferenced array of
    /// the same size allocated just before it, so that a compacting collection has gaps to close and moves the blocks.
    /// </summary>
    private sealed class MovableMemoryPoolFactory : IMemoryPoolFactory<byte>
    {
        private long _outstanding;

        public long Outstanding => Interlocked.Read(ref _outstanding);

        public MemoryPool<byte> Create(MemoryPoolOptions? options = null) => new Pool(this);

        private sealed class Pool(MovableMemoryPoolFactory factory) : MemoryPool<byte>
        {
            public override int MaxBufferSize => DiagnosticMemoryPoolFactory.BlockSize;

            public override IMemoryOwner<byte> Rent(int minBufferSize = -1)
            {
                GC.KeepAlive(new byte[DiagnosticMemoryPoolFactory.BlockSize]);
                Interlocked.Increment(ref factory._outstanding);
                return new Block(factory, new byte[DiagnosticMemoryPoolFactory.BlockSize]);
            }

            protected override void Dispose(bool disposing)
            {
            }
        }

        private sealed class Block(MovableMemoryPoolFactory factory, byte[] array) : IMemoryOwner<byte>
        {
            private int _returned;

            public Memory<byte> Memory => array;

            public void Dispose()
            {
                if (Interlocked.Exchange(ref _returned, 1) == 0)
                {
                    Interlocked.Decrement(ref factory._outstanding);
                }
            }
        }
    }
}
